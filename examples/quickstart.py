"""Quickstart: a program is a decorated function; `s` is its state.

    python examples/quickstart.py                      # in-process runtime, embedded model
    python examples/quickstart.py --url http://127.0.0.1:30000   # a running agentlang server
"""

import argparse

import agentlang as al


@al.function
def qa(s, question):
    s += al.system("You are a helpful assistant. Answer in one short sentence.")
    s += al.user(question)
    s += al.assistant(al.gen("answer"))


def main(backend, max_tokens=32):
    state = qa.run(question="What is the capital of France?", backend=backend,
                   max_new_tokens=max_tokens, temperature=0)
    answer = state["answer"]
    assert "Paris" in answer, answer
    return answer


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="agentlang server URL (default: in-process runtime)")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    with (al.RuntimeEndpoint(args.url) if args.url else al.Runtime()) as backend:
        print(main(backend, max_tokens=args.max_tokens))
