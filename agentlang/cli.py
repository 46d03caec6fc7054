"""The ``agentlang`` command line. One function per subcommand registers it on the parser;
adding a subcommand is one ``add_*_command`` function plus one entry in ``COMMANDS``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


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


def add_graph_command(sub: argparse._SubParsersAction) -> None:
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


COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (add_graph_command,)


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
