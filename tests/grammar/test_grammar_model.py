"""Constrained greedy decoding with the embedded model (HF transformers Llama): the 20-schema
set on both backends and regexes/choices/Lark/pydantic, each as one batch through
``model.generate`` with a logits processor that calls :func:`apply_grammar_masks`; and exact
jump-forward (identical text, fewer forward passes) with a hand-written KV-cache loop. The
engine-level 3-prompt validation belongs in bench/structured.py."""

from __future__ import annotations

import json
import re

import jsonschema
import lark
import pydantic
import pytest
import torch

import data.schemas as S
from agentlang.runtime.grammar import apply_grammar_masks, constraint_from_params, make_grammar_backend
from agentlang.runtime.engine.draft_verify import verify_draft
from agentlang.runtime.grammar.jump_forward import draft_tokens

pytestmark = pytest.mark.slow
VOCAB_SIZE = 49152


CALC = S.CALC
SCHEMA_BY_NAME = {name: schema for name, schema, _ in S.SCHEMAS}




class City(pydantic.BaseModel):
    name: str
    country: str
    population_millions: int = pydantic.Field(ge=0, le=100)
    is_capital: bool


IPV4 = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"
ISO_DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
CHOICES = ["sunny", "rainy", "snowy and cold"]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """On the shared 2-core box, 2 OpenMP threads competing with other jobs spin-wait and run
    ~10x slower than 1 thread; use one for this module and restore the setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def backends(tokenizer):
    return {name: make_grammar_backend(name, tokenizer, VOCAB_SIZE)
            for name in ("xgrammar", "outlines")}


class Decoder:
    """Greedy decoding under a grammar with HF's KV cache; counts forward passes."""

    def __init__(self, model, tokenizer):
        self.model, self.tok = model, tokenizer

    def prompt(self, text: str) -> list[int]:
        return list(self.tok.apply_chat_template([{"role": "user", "content": text}],
                                                 add_generation_prompt=True, tokenize=True,
                                                 return_dict=False))

    @torch.no_grad()
    def run(self, prompt: str, matcher, max_new_tokens: int, jump_forward: bool = True):
        """Returns (text, forward passes). With ``jump_forward`` the forced text is drafted and
        verified in the same pass (exact: same tokens as without)."""
        from transformers import DynamicCache

        cache, ids = DynamicCache(), self.prompt(prompt)
        n_prompt, fed, draft, passes = len(ids), 0, [], 0
        stop = set(matcher.vocab.stop_ids)
        greedy = lambda i, row: int(row.argmax(-1))  # noqa: E731
        while len(ids) - n_prompt < max_new_tokens and not matcher.is_terminated():
            feed = ids[fed:] + draft
            logits = self.model(torch.tensor([feed]), past_key_values=cache, use_cache=True).logits
            passes += 1
            rows = logits[0, -(len(draft) + 1):].float()  # [len(draft) + 1, V]
            new = verify_draft(matcher, draft, rows, greedy)
            fed = len(ids) + len(new) - 1  # the matched draft prefix has KV; the last token not
            if cache.get_seq_length() > fed:
                cache.crop(fed - cache.get_seq_length())
            ids += [t for t in new if t not in stop]
            if stop & set(new) or matcher.is_terminated():
                break
            draft = draft_tokens(matcher, self.tok) if jump_forward else []
        return self.tok.decode(ids[n_prompt:]), passes


@pytest.fixture(scope="module")
def decoder(hf_model, tokenizer):
    torch.manual_seed(0)
    return Decoder(hf_model, tokenizer)


def schema_prompt(schema: dict) -> str:
    return f"Generate a JSON object that follows this JSON schema:\n{json.dumps(schema)}"


def check_valid(text: str, schema: dict) -> None:
    validator = jsonschema.validators.validator_for(schema)
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(json.loads(text))


class GrammarProcessor:
    """HF ``LogitsProcessor``: feeds each row's last token to its matcher, then masks the batch
    with one :func:`apply_grammar_masks` call (rows without a matcher stay untouched)."""

    def __init__(self, matchers):
        self.matchers = list(matchers)
        self.prompt_len: int | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        else:
            for i, m in enumerate(self.matchers):
                if m is None:
                    continue
                token = int(input_ids[i, -1])
                assert m.accept_token(token), f"row {i}: sampled a masked token {token}"
                if token in m.vocab.stop_ids:
                    self.matchers[i] = None  # finished: HF pads this row from now on
        apply_grammar_masks(scores, self.matchers)
        return scores


def generate_batch(model, decoder, prompts, matchers, max_new_tokens):
    """Greedy batched generation (left-padded); returns each row's text up to its stop token."""
    from transformers import LogitsProcessorList

    rows = [decoder.prompt(p) for p in prompts]
    width = max(len(r) for r in rows)
    pad = decoder.tok.pad_token_id if decoder.tok.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    stop = list(next(m for m in matchers if m is not None).vocab.stop_ids)
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=stop, pad_token_id=pad,
                             logits_processor=LogitsProcessorList([GrammarProcessor(matchers)]))
    texts = []
    for row in out[:, width:].tolist():
        cut = next((i for i, t in enumerate(row) if t in stop), len(row))
        texts.append(decoder.tok.decode(row[:cut]))
    return texts


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_schema_set(backends, hf_model, decoder, backend):
    """The 20-schema set, one prompt each, decoded as one batch (outlines: the 17 it supports)."""
    names = [n for n in SCHEMA_BY_NAME
             if backend == "xgrammar" or n not in S.OUTLINES_UNSUPPORTED]
    matchers = [backends[backend].compile(constraint_from_params(json_schema=SCHEMA_BY_NAME[n]))
                .new_matcher() for n in names]
    texts = generate_batch(hf_model, decoder, [schema_prompt(SCHEMA_BY_NAME[n]) for n in names],
                           matchers, max_new_tokens=80)
    failures = []
    for name, text, m in zip(names, texts, matchers):
        try:
            check_valid(text, SCHEMA_BY_NAME[name])
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{name}: {text!r}: {e}")
    print("\n".join(f"{n}: {t}" for n, t in zip(names, texts)))
    assert not failures, "\n".join(failures)


def test_regex_choices_lark_pydantic_in_one_batch(backends, hf_model, decoder):
    """Mixed constraint kinds and backends, plus an unconstrained row, in one batch."""
    cases = [  # (prompt, backend, constraint params, check)
        ("What is the IP address of the Google DNS servers?", "xgrammar", dict(regex=IPV4),
         lambda t: re.fullmatch(IPV4, t)),
        ("On what date did Apollo 11 land on the moon? Answer in ISO format.", "outlines",
         dict(regex=ISO_DATE), lambda t: re.fullmatch(ISO_DATE, t)),
        ("Give a US phone number for a pizza shop.", "xgrammar", dict(regex=PHONE),
         lambda t: re.fullmatch(PHONE, t)),
        ("What is the weather like in the Sahara desert?", "outlines", dict(choices=CHOICES),
         lambda t: t in CHOICES),
        ("Write an arithmetic expression whose value is 12.", "xgrammar", dict(grammar=CALC),
         lambda t: lark.Lark(CALC).parse(t) is not None),
        ("Describe Paris as JSON.", "xgrammar", dict(json_schema=City),
         lambda t: City.model_validate_json(t).name),
        ("Name one primary color.", None, None, lambda t: True),
    ]
    matchers = [None if b is None else backends[b].compile(constraint_from_params(**c)).new_matcher()
                for _, b, c, _ in cases]
    texts = generate_batch(hf_model, decoder, [p for p, _, _, _ in cases], matchers,
                           max_new_tokens=40)
    print(texts)
    for (prompt, _, params, check), text in zip(cases, texts):
        assert check(text), (params, text)


def test_exact_jump_forward_same_text_fewer_passes(backends, decoder):
    compiled = backends["xgrammar"].compile(constraint_from_params(json_schema=S.KEY_HEAVY))
    prompt = schema_prompt(S.KEY_HEAVY)
    off_text, off_passes = decoder.run(prompt, compiled.new_matcher(), 96, jump_forward=False)
    on_text, on_passes = decoder.run(prompt, compiled.new_matcher(), 96, jump_forward=True)
    print(f"forward passes: off {off_passes}, exact jump-forward {on_passes}")
    assert on_text == off_text
    check_valid(off_text, S.KEY_HEAVY)
    assert on_passes <= 0.7 * off_passes
