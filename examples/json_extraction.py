"""JSON extraction: a pydantic model in, a validated instance out, for many texts at once.

`gen(json_schema=Person)` constrains decoding to the model's JSON schema, so the output always
parses; `run_batch` runs the program once per text, batched by the runtime, with the shared
instruction prefix computed once.

    python examples/json_extraction.py [--url URL] [--max-tokens N]
"""

import argparse

from pydantic import BaseModel, Field

import agentlang as al


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)
    city: str = Field(max_length=20)


TEXTS = [
    "Alice Martin, 31, moved to Lyon last spring to open a bakery.",
    "At 58, retired pilot Bob Chen still flies gliders around Denver every weekend.",
    "Carla Diaz is 24 and studies marine biology in Lisbon.",
]


@al.function
def extract(s, text):
    s += al.system("You extract facts about people as JSON.")
    s += al.user("Text: Dan Wu, 45, teaches piano in Boston.")
    s += al.assistant('{"name": "Dan Wu", "age": 45, "city": "Boston"}')
    s += al.user("Text: " + text)
    s += al.assistant(al.gen("person", json_schema=Person))


def main(backend, max_tokens=64):
    states = extract.run_batch([{"text": t} for t in TEXTS], backend=backend,
                               max_new_tokens=max_tokens, temperature=0)
    people = [Person.model_validate_json(st["person"]) for st in states]
    for text, person in zip(TEXTS, people):
        assert person.name in text and str(person.age) in text and person.city in text, person
    return people


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="agentlang server URL (default: in-process runtime)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    with (al.RuntimeEndpoint(args.url) if args.url else al.Runtime()) as backend:
        for person in main(backend, max_tokens=args.max_tokens):
            print(person)
