"""The ``agentlang`` command line. One function per subcommand registers it on the parser;
adding a subcommand is one ``add_*_command`` function plus one entry in ``COMMANDS``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol


class SubParsers(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns, as far as commands use it."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def load_program(spec: str):
    """``module:function`` or ``path/to/file.py:function`` → the Program object."""
    from agentlang.program import Program

    if ":" not in spec:
        raise ValueError(f"expected module:function or file.py:function, got {spec!r}")
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"no such file: {target}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules.setdefault(path.stem, module)
        module_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(target)
    program = getattr(module, attr, None)
    if program is None:
        raise ValueError(f"{target} has no attribute {attr!r}")
    if not isinstance(program, Program):
        raise ValueError(f"{spec} is not an @agentlang.function program")
    return program


def _parse_args(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--arg expects name=value, got {pair!r}")
        name, _, value = pair.partition("=")
        out[name] = value
    return out


def run_graph(args: argparse.Namespace) -> int:
    program = load_program(args.program)
    graph = program.trace(strict=not args.partial, **_parse_args(args.arg))
    out = Path(args.output)
    suffix = out.suffix.lower()
    if suffix == ".dot":
        out.write_text(graph.to_dot())
    elif suffix in (".mmd", ".mermaid"):
        out.write_text(graph.to_mermaid())
    else:
        graph.draw(out)
    print(f"wrote {out} ({len(graph.nodes)} nodes, {len(graph.edges)} edges"
          + (f"; truncated: {graph.truncated}" if graph.truncated else "") + ")")
    return 0


def add_graph_command(sub: SubParsers) -> None:
    p = sub.add_parser("graph", help="draw a program's dependency graph",
                       description="Trace a program (no model is called) and draw its "
                                   "dependency graph as PNG/SVG/PDF, or write DOT/Mermaid.")
    p.add_argument("program", help="module:function or path/to/file.py:function")
    p.add_argument("-o", "--output", default="graph.svg",
                   help="output file: .png, .svg, .pdf, .dot or .mmd (default graph.svg)")
    p.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                   help="give an argument a concrete value while tracing (repeatable)")
    p.add_argument("--partial", action="store_true",
                   help="draw what was traced if the program cannot be traced to the end")
    p.set_defaults(handler=run_graph)


def run_generate(args: argparse.Namespace) -> int:
    from agentlang.runtime import Engine, SamplingParams
    from agentlang.runtime.weights.model_loader import ModelLoadError

    try:
        engine = Engine(args.model, dtype=args.dtype)
    except ModelLoadError as e:
        raise ValueError(str(e)) from None
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
    if args.stream:
        for delta in engine.generate_stream(prompt, params):
            print(delta.text, end="", flush=True)
        print()
    else:
        print(engine.generate(prompt, params).text)
    return 0


def add_generate_command(sub: SubParsers) -> None:
    p = sub.add_parser("generate", help="complete a prompt with the local engine",
                       description="Complete PROMPT (greedy by default) with the embedded model "
                                   "or a local HF directory.")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--chat", action="store_true", help="wrap PROMPT as a user chat message")
    p.add_argument("--stream", action="store_true", help="print tokens as they come")
    p.add_argument("--model", default="default", help="'default' or a local HF model directory")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.set_defaults(handler=run_generate)


def run_kv_plan(args: argparse.Namespace) -> int:
    from agentlang.runtime.models.kv_plan import plan_for_model

    p = plan_for_model(args.model, context=args.context, memory_gb=args.memory_gb,
                       kv_dtype=args.kv_dtype, page_size=args.page_size, model_dtype=args.dtype,
                       weights=args.weights)
    print(p.format())
    return 0


def add_kv_plan_command(sub: SubParsers) -> None:
    from agentlang.runtime.models.kv_plan import PLAN_KV_DTYPES, WEIGHT_FORMATS

    p = sub.add_parser("kv-plan", help="KV cache capacity: bytes per token/request, max requests",
                       description="Compute KV bytes per token and per request, the weights' "
                                   "size and the maximum concurrent requests at a context length "
                                   "from a model's config (nothing is loaded onto a device).")
    p.add_argument("--model", default="default",
                   help="'default', a .gguf file, or a local directory with a config.json "
                        "(weights optional: without them the size is computed from the config)")
    p.add_argument("--weights", default=None, choices=tuple(WEIGHT_FORMATS),
                   help="weight storage format for the estimate (default: the GGUF file's own "
                        "sizes, else the model dtype)")
    p.add_argument("--context", type=int, default=32768, help="tokens per request (default 32768)")
    p.add_argument("--memory-gb", type=float, default=80.0,
                   help="device memory in GiB for weights + KV cache (default 80)")
    p.add_argument("--kv-dtype", default="auto", choices=PLAN_KV_DTYPES,
                   help="KV storage dtype (default auto: the model dtype)")
    p.add_argument("--page-size", type=int, default=16, help="tokens per KV page (default 16)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="model dtype (default: the config's torch_dtype, else bfloat16)")
    p.set_defaults(handler=run_kv_plan)


def add_serve_command(sub: SubParsers) -> None:
    from agentlang.runtime.server.cli import add_serve_command as add_server_command

    add_server_command(sub)    # flags of agentlang.runtime.server.cli; handler = serve_main


COMMANDS: tuple[Callable[[SubParsers], None], ...] = (
    add_generate_command, add_graph_command, add_kv_plan_command, add_serve_command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentlang", description="agentlang command line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ValueError as e:
        print(f"agentlang {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
