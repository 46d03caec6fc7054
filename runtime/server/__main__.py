"""``python -m runtime.server``: serve a model over HTTP (see ``--help``)."""

from runtime.server.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
