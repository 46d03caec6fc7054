"""Token logprobs in the three wire formats: OpenAI chat, OpenAI completions, native (SGLang).

:class:`TokenTexts` maps a token id to its exact bytes (byte-level BPE tokens are decoded through
the GPT-2 byte alphabet, ``<0xHH>`` byte-fallback tokens to their byte) and a display string;
a token that is part of a multi-byte character shows as U+FFFD but keeps its true bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from agentlang.runtime.sampling.sampler import TokenLogprob

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: printable stand-in character → byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenTexts:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._byte_decoder = _byte_decoder()
        self._cache: dict[int, tuple[str, bytes]] = {}

    def get(self, token_id: int) -> tuple[str, bytes]:
        hit = self._cache.get(token_id)
        if hit is not None:
            return hit
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        m = _BYTE_FALLBACK.match(piece or "")
        if m:
            raw = bytes([int(m.group(1), 16)])
        elif piece and all(c in self._byte_decoder for c in piece) \
                and token_id not in self.tokenizer.all_special_ids:
            raw = bytes(self._byte_decoder[c] for c in piece)
        else:
            raw = self.tokenizer.decode([token_id]).encode("utf-8")
        out = (raw.decode("utf-8", errors="replace"), raw)
        self._cache[token_id] = out
        return out

    def text(self, token_id: int) -> str:
        return self.get(token_id)[0]


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


def chat_logprobs(lps: Sequence[TokenLogprob], texts: TokenTexts, top: int) -> dict:
    """``choices[i].logprobs`` of a chat completion: ``{"content": [...]}``."""
    content = []
    for lp in lps:
        tok, raw = texts.get(lp.token_id)
        alts = []
        for tid, alp in lp.top[:top]:
            t, b = texts.get(tid)
            alts.append({"token": t, "logprob": _finite(alp), "bytes": list(b)})
        content.append({"token": tok, "logprob": _finite(lp.logprob), "bytes": list(raw),
                        "top_logprobs": alts})
    return {"content": content, "refusal": None}


def completion_logprobs(lps: Sequence[TokenLogprob], texts: TokenTexts, top: int,
                        offset: int = 0) -> dict:
    """``choices[i].logprobs`` of a text completion (legacy format); ``offset`` is where the
    first token's text starts in the choice's text."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for lp in lps:
        tok = texts.text(lp.token_id)
        tokens.append(tok)
        token_lps.append(_finite(lp.logprob))
        alts: dict[str, float] = {}
        for tid, alp in lp.top[:top]:
            alts.setdefault(texts.text(tid), _finite(alp))
        tops.append(alts)
        offsets.append(offset)
        offset += len(tok)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}


def native_logprobs(lps: Sequence[TokenLogprob], texts: TokenTexts,
                    top: int) -> tuple[list, list | None]:
    """``(output_token_logprobs, output_top_logprobs)``: ``[logprob, token_id, text]`` triples;
    the second is ``None`` when ``top`` is 0."""
    chosen = [[_finite(lp.logprob), lp.token_id, texts.text(lp.token_id)] for lp in lps]
    if not top:
        return chosen, None
    tops = [[[_finite(a), tid, texts.text(tid)] for tid, a in lp.top[:top]] for lp in lps]
    return chosen, tops
