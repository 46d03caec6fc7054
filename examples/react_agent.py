"""ReAct agent: Thought / Action / Observation steps, each action picked with `select`.

Every step the model writes a thought, chooses an action from a fixed list by
log-probability (`al.select`), then the action's argument from the tool's table; the Python
tool's result is appended as the observation. The loop ends when the model selects `finish`.

    python examples/react_agent.py [--url URL] [--max-tokens N]
"""

import argparse

import agentlang as al

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima", "Kenya": "Nairobi"}
POPULATION_M = {"Paris": 2.1, "Tokyo": 14.0, "Lima": 10.1, "Nairobi": 4.4}  # millions


def capital(country: str) -> str:
    return CAPITALS[country]


def population(city: str) -> str:
    return f"{POPULATION_M[city]} million"


# action name -> (Python tool, the arguments it accepts)
TOOLS = {"capital": (capital, list(CAPITALS)), "population": (population, list(POPULATION_M))}

EXAMPLE = """Question: How many people live in the capital of Italy?
Thought: I need the capital of Italy first.
Action: capital
Argument: Italy
Observation: Rome
Thought: Now I need the population of Rome.
Action: population
Argument: Rome
Observation: 2.8 million
Thought: I know the answer.
Action: finish
Answer: 2.8 million

"""


@al.function
def react(s, question, max_steps, max_tokens):
    s += "Answer questions using the tools: " + ", ".join(TOOLS) + ".\n\n" + EXAMPLE
    s += "Question: " + question + "\n"
    trajectory = []
    for _ in range(max_steps):
        s += "Thought:" + al.gen("thought", max_tokens=max_tokens, stop="\n") + "\n"
        s += "Action: " + al.select("action", list(TOOLS) + ["finish"]) + "\n"
        if s["action"] == "finish":
            break
        tool, arguments = TOOLS[s["action"]]
        s += "Argument: " + al.select("argument", arguments) + "\n"
        observation = tool(s["argument"])
        trajectory.append((s["action"], s["argument"], observation))
        s += "Observation: " + observation + "\n"
    s += "Answer:" + al.gen("answer", max_tokens=max_tokens, stop="\n")
    return trajectory


def main(backend, max_tokens=24):
    state = react.run(question="How many people live in the capital of Japan?", max_steps=4,
                      max_tokens=max_tokens, backend=backend, temperature=0)
    trajectory = state.ret_value
    assert state["action"] == "finish", trajectory          # the agent decided it was done
    assert [step[0] for step in trajectory] == ["capital", "population"], trajectory
    assert trajectory[-1][2] in state["answer"], (state["answer"], trajectory)  # tool result used
    return state["answer"].strip(), trajectory


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="agentlang server URL (default: in-process runtime)")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    with (al.RuntimeEndpoint(args.url) if args.url else al.Runtime()) as backend:
        answer, trajectory = main(backend, max_tokens=args.max_tokens)
        for step in trajectory:
            print("%s(%s) -> %s" % step)
        print("Answer:", answer)
