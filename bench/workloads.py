"""Deterministic synthetic workloads shared by the benchmarks (no data downloads)."""

from __future__ import annotations

import random
from dataclasses import dataclass

WORDS = (
    "system request cache prefix token model batch page memory engine schedule answer question "
    "library catalogue author title shelf river mountain forest city harbour market bridge "
    "garden window lantern music painter engineer doctor teacher student village station "
    "morning evening winter summer quickly carefully bright quiet ancient modern simple useful "
    "travel build write read count measure compare explain describe remember imagine discover"
).split()


@dataclass(frozen=True)
class Item:
    prompt_ids: list[int]
    max_new_tokens: int


def text_of_tokens(tokenizer, n_tokens: int, rng: random.Random) -> list[int]:
    """Token ids of pseudo-English text, exactly ``n_tokens`` long."""
    ids: list[int] = []
    while len(ids) < n_tokens:
        sentence = " ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + ". "
        ids.extend(tokenizer.encode(sentence, add_special_tokens=False))
    return ids[:n_tokens]


def shared_prefix_chat(tokenizer, n_requests: int = 64, system_tokens: int = 1024,
                       question_tokens: int = 32, new_tokens: int = 32, seed: int = 0) -> list[Item]:
    """One long system prompt shared by every request + a unique question each."""
    rng = random.Random(seed)
    system = text_of_tokens(tokenizer, system_tokens, rng)
    return [Item(system + text_of_tokens(tokenizer, question_tokens, rng), new_tokens)
            for _ in range(n_requests)]


def independent(tokenizer, n_requests: int = 64, prompt_range=(64, 512), new_range=(32, 128),
                seed: int = 1) -> list[Item]:
    """Unique prompts of random length, random output lengths."""
    rng = random.Random(seed)
    return [Item(text_of_tokens(tokenizer, rng.randint(*prompt_range), rng),
                 rng.randint(*new_range)) for _ in range(n_requests)]
