"""``python -m agentlang.runtime.server``: serve a model over HTTP (see ``--help``)."""

from agentlang.runtime.server.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
