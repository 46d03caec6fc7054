"""``OutputText``'s decode: a fast tokenizer without a clean-up pass decodes through its backend
(what ``tokenizer.decode`` runs, without converting the ids in Python each call), to the same
text; any other tokenizer through ``tokenizer.decode``."""

from __future__ import annotations

import random

import pytest

from agentlang.runtime.request.detokenizer import OutputText, text_decoder


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from agentlang.runtime.weights.model_loader import resolve_model

    return AutoTokenizer.from_pretrained(str(resolve_model("default", "dense").path))


@pytest.mark.parametrize("skip", [True, False])
def test_the_backend_decode_is_the_tokenizers_text(tokenizer, skip):
    assert tokenizer.clean_up_tokenization_spaces is False
    rng = random.Random(0)
    special = sorted(tokenizer.all_special_ids)
    decode = text_decoder(tokenizer, skip)
    for n in (1, 7, 64, 300):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(n)]
        ids[rng.randrange(n)] = rng.choice(special)
        assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=skip)
    text = "Héllo, wörld! 你好 🙂\n  def f(x):\treturn x"
    ids = tokenizer.encode(text, add_special_tokens=False)
    out = OutputText(tokenizer, stop=["return"])
    for t in ids:
        hit = out.append(t)
        if hit:
            break
    assert hit == "return" and out.text == text[:text.index("return")]


def test_other_tokenizers_decode_as_they_do():
    class Plain:                       # no fast backend: its own decode
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(97 + i) for i in ids if not (skip_special_tokens and i == 0))

    class CleansUp(Plain):             # a backend, but a clean-up pass on top of it
        clean_up_tokenization_spaces = True
        backend_tokenizer = object()   # never called

    for tok in (Plain(), CleansUp()):
        assert text_decoder(tok, True)([0, 1, 2]) == "bc"
        assert text_decoder(tok, False)([0, 1, 2]) == "abc"
