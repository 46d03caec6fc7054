"""``make run``: serve the embedded model over HTTP in the foreground (Ctrl-C stops it).

Prints how to call the server first (a curl line and an ``openai`` client snippet), then runs
:func:`agentlang.runtime.server.cli.serve_main` with the default flags, except that ``--weights`` defaults to
``auto`` (the embedded GGUF runs on its quantized tensors; any ``agentlang serve`` flag may
be passed: ``python -m agentlang.runtime.server.main_job --port 8000``).
"""

from __future__ import annotations

import argparse
import sys

from agentlang.runtime.server.cli import add_serve_arguments, serve_main


def how_to_call(host: str, port: int, api_key: str | None = None) -> str:
    url = f"http://{host}:{port}"
    auth = f" -H 'Authorization: Bearer {api_key}'" if api_key else ""
    body = ('{"model": "default", "messages": [{"role": "user", "content": '
            '"What is a radix tree?"}], "max_tokens": 64}')
    return "\n".join([
        "How to call it (once it says it is serving):",
        "",
        f"  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\",
        f"       -d '{body}'",
        "",
        "  from openai import OpenAI",
        f'  client = OpenAI(base_url="{url}/v1", api_key="{api_key or "none"}")',
        "  reply = client.chat.completions.create(",
        '      model="default", max_tokens=64,',
        '      messages=[{"role": "user", "content": "What is a radix tree?"}])',
        "  print(reply.choices[0].message.content)",
        "",
        f"  Native API: POST {url}/generate; metrics: GET {url}/metrics",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = add_serve_arguments(argparse.ArgumentParser(
        prog="python -m agentlang.runtime.server.main_job",
        description="Serve the embedded model over HTTP (what `make run` starts)."))
    parser.set_defaults(weights="auto")      # the embedded GGUF runs on its quantized tensors
    args = parser.parse_args(argv)
    print(how_to_call(args.host, args.port, args.api_key), flush=True)
    return serve_main(args)


if __name__ == "__main__":
    sys.exit(main())
