"""`make run`: answer a chat prompt with the embedded model through the engine."""

from runtime import Engine, SamplingParams


def main() -> None:
    engine = Engine()
    question = "In two sentences, what is a radix tree and why is it useful for caching prompts?"
    out = engine.chat([{"role": "user", "content": question}],
                      SamplingParams(max_tokens=96, temperature=0))
    print(f"Q: {question}\nA: {out.text.strip()}")


if __name__ == "__main__":
    main()
