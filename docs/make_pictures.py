"""Draws the README's two pictures with the project's own tools:

* docs/img/program_graph.png — the dependency graph of a fork/join program (tracer, no model);
* docs/img/radix_tree.png — the runtime's radix prefix cache right after that program ran on
  the embedded model: the shared prefix stored once, one branch per fork.

    python docs/make_pictures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import agentlang as al  # noqa: E402
from agentlang.runtime.cache.radix_draw import draw_radix_tree  # noqa: E402


@al.function
def pros_and_cons(s, topic):
    s += al.system("You are a careful analyst. Answer in one short sentence.")
    s += al.user(f"Topic: {topic}. Give one argument.")
    forks = s.fork(3)
    for f, angle in zip(forks, ["economic", "social", "technical"]):
        f += al.assistant(f"One {angle} argument: " + al.gen("argument", max_tokens=16))
    forks.join()
    s += al.user("Which angle matters most?")
    s += al.assistant(al.select("verdict", choices=["economic", "social", "technical"]))


def main() -> None:
    out = ROOT / "docs" / "img"
    out.mkdir(parents=True, exist_ok=True)
    pros_and_cons.trace(topic="remote work").draw(out / "program_graph.png")
    backend = al.Runtime(page_size=16, kv_budget_mb=128)
    state = pros_and_cons.run(topic="remote work", temperature=0, backend=backend)
    print("arguments:", state["argument"], "verdict:", state["verdict"])
    draw_radix_tree(backend.engine.cache, out / "radix_tree.png", backend.engine.tokenizer,
                    title="Radix cache after fork(3): shared prefix once, three branches")
    backend.close()
    print(f"wrote {out / 'program_graph.png'} and {out / 'radix_tree.png'}")


if __name__ == "__main__":
    main()
