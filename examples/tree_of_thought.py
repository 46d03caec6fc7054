"""Tree of thought: sample several next steps with `fork`, let a judge `select` the best.

At every level the partial solution forks into `width` branches that each sample one
candidate step (sharing the prompt's KV cache pages); `join` gathers the candidates, a
judge (in a copy of the state) picks one with `select`, and the chosen step extends the
solution. `depth` levels give a search over width ** depth paths, visiting depth * width.

    python examples/tree_of_thought.py [--url URL] [--max-tokens N] [--depth D] [--width W]
"""

import argparse

import agentlang as al


@al.function
def tree_of_thought(s, problem, depth, width, max_tokens):
    s += al.system("You solve problems step by step, one short step per line.")
    s += al.user(problem)
    s += al.assistant_begin()
    levels, path = [], []
    for level in range(1, depth + 1):
        branches = s.fork(width)
        branches += lambda i: f"Step {level}:" + al.gen(
            "step", max_tokens=max_tokens, stop="\n", temperature=0.8, seed=i)
        branches.join()  # s["step"]: one candidate per branch
        candidates = [c.strip() for c in s["step"]]
        options = "\n".join(f"{i + 1}. {c}" for i, c in enumerate(candidates))
        with s.copy() as judge:
            judge += al.assistant_end()
            judge += al.user(f"Which is the best step {level}?\n{options}")
            judge += al.assistant("The best is " + al.select(
                "best", [str(i + 1) for i in range(width)]))
        chosen = candidates[int(s["best"][0]) - 1]  # the copy's variables come back as lists
        levels.append(candidates)
        path.append(chosen)
        s += f"Step {level}: {chosen}\n"
    s += al.assistant_end()
    s += al.user("Summarize the plan in one sentence.")
    s += al.assistant(al.gen("summary", max_tokens=max_tokens))
    return levels, path


def main(backend, max_tokens=24, depth=2, width=3):
    state = tree_of_thought.run(problem="How can a small cafe attract more customers?",
                                depth=depth, width=width, max_tokens=max_tokens,
                                backend=backend, temperature=0)
    levels, path = state.ret_value
    assert len(levels) == depth and all(len(c) == width for c in levels), levels
    assert len(path) == depth and all(step in c for step, c in zip(path, levels)), path
    assert all(f"Step {i + 1}: {step}\n" in state.text() for i, step in enumerate(path))
    return path, levels, state["summary"].strip()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="agentlang server URL (default: in-process runtime)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--width", type=int, default=3)
    args = parser.parse_args()
    with (al.RuntimeEndpoint(args.url) if args.url else al.Runtime()) as backend:
        path, levels, summary = main(backend, max_tokens=args.max_tokens, depth=args.depth,
                                     width=args.width)
        for level, (candidates, chosen) in enumerate(zip(levels, path), 1):
            for c in candidates:
                print(f"step {level} {'*' if c == chosen else ' '} {c}")
        print("Summary:", summary)
