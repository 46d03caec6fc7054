"""Multi-agent debate: agents with their own system prompts argue over a shared transcript.

Each round forks the conversation once per agent (the shared transcript is a radix-tree
prefix computed once; the branches decode in one batch), joins their arguments back into
the transcript, and after the last round a judge picks the winner with `select`.

    python examples/multi_agent_debate.py [--url URL] [--max-tokens N] [--rounds N]
"""

import argparse

import agentlang as al

AGENTS = {
    "optimist": "You are an optimistic debater. You argue for the proposal.",
    "skeptic": "You are a skeptical debater. You argue against the proposal.",
}
JUDGE = "You are an impartial judge. You decide which debater made the stronger case."


@al.function
def debate(s, proposal, rounds, max_tokens):
    s += al.user("Proposal: " + proposal)
    transcript = []
    for r in range(rounds):
        forks = s.fork(len(AGENTS))
        for agent, persona in zip(forks, AGENTS.values()):
            agent += al.system(persona)
            agent += al.user(f"Round {r + 1}. Give one new reason, in one sentence.")
            agent += al.assistant(al.gen("argument", max_tokens=max_tokens, stop="\n"))
        forks.join()  # s["argument"] is now the list of the agents' arguments
        lines = [f"{name}: {arg.strip()}" for name, arg in zip(AGENTS, s["argument"])]
        transcript.append(lines)
        s += al.user(f"Round {r + 1}\n" + "\n".join(lines))
    s += al.system(JUDGE)
    s += al.user("Who won the debate, the " + " or the ".join(AGENTS) + "?")
    s += al.assistant("The winner is the " + al.select("verdict", list(AGENTS)))
    return transcript


def main(backend, max_tokens=40, rounds=2):
    state = debate.run(proposal="Cities should replace all cars downtown with bicycles.",
                       rounds=rounds, max_tokens=max_tokens, backend=backend, temperature=0)
    transcript = state.ret_value
    assert len(transcript) == rounds and all(len(r) == len(AGENTS) for r in transcript)
    assert all(line.split(": ", 1)[1] for r in transcript for line in r), transcript
    assert state["verdict"] in AGENTS
    assert len(state.get_meta_info("verdict")["scores"]) == len(AGENTS)
    return state["verdict"], transcript


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="agentlang server URL (default: in-process runtime)")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with (al.RuntimeEndpoint(args.url) if args.url else al.Runtime()) as backend:
        verdict, transcript = main(backend, max_tokens=args.max_tokens, rounds=args.rounds)
        for r, lines in enumerate(transcript):
            print(f"-- round {r + 1}\n" + "\n".join(lines))
        print("Verdict:", verdict)
