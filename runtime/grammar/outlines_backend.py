"""outlines-core backend: everything is a regex compiled to a token-level automaton (``Index``).

JSON schemas go through outlines-core's schema→regex builder with no whitespace (compact
output); ``json_indent`` and Lark ``grammar`` constraints are refused with ``ValueError``, as are
schema keywords it would not enforce (:mod:`schema_support`). Recursive ``$ref``s are unrolled to
depth 3 (:mod:`schema_unroll`; outputs stay valid, deeper nesting is not generated). Index construction is slow
(seconds for schemas with long bounded strings), which is why compilation runs off the engine
loop. Jump-forward walks the automaton one single-byte token at a time while exactly one byte is
possible (a byte that only occurs inside multi-byte tokens ends the forced text there).

Known outlines-core 0.2.14 limitation: in a state where the whole regex is already matched, the
index only keeps transitions that stay in the final loop; e.g. for ``[0-9]+(\\.[0-9]+)?`` after
the token ``3`` it allows digits and EOS but not ``.``, and for choices ``a``/``ab`` (tokenized
``a``, ``b``) it stops at ``a``. Outputs still always match (a subset of the language is
generated); JSON is unaffected because its only final state is after the closing bracket.

The tokenizer's vocabulary is decoded and the masks are applied with xgrammar's decoder and
kernel (:mod:`agentlang.runtime.grammar.xgrammar_backend`), so this backend needs xgrammar installed too.
"""

from __future__ import annotations

import json

import torch

from agentlang.runtime.grammar.base import BitmaskKernel, CompiledGrammar, GrammarBackend, GrammarMatcher
from agentlang.runtime.grammar.completion import ShortestCompletion
from agentlang.runtime.grammar.token_table import TokenTable
from agentlang.runtime.grammar.constraints import Constraint
from agentlang.runtime.grammar.schema_support import check_schema_support
from agentlang.runtime.grammar.schema_unroll import bound_recursion
from agentlang.runtime.grammar.vocab import TokenVocab
from agentlang.runtime.grammar.xgrammar_backend import xgrammar_bitmask_kernel

MAX_ROLLBACK_TOKENS = 1 << 16
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")
_MAX_JUMP_BYTES = 4096


def regex_escape(text: str) -> str:
    """``text`` as a literal in outlines-core's (Rust) regex syntax."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def strip_anchors(regex: str) -> str:
    """Drop a leading ``^`` and an unescaped trailing ``$``: no-ops under full-match semantics,
    but outlines-core refuses anchored patterns."""
    if regex.startswith("^"):
        regex = regex[1:]
    if regex.endswith("$"):
        backslashes = len(regex[:-1]) - len(regex[:-1].rstrip("\\"))
        if backslashes % 2 == 0:
            regex = regex[:-1]
    return regex


class OutlinesBackend(GrammarBackend):
    name = "outlines"

    def __init__(self, vocab: TokenVocab):
        import outlines_core as oc

        self.vocab = vocab
        self.token_table = TokenTable(vocab)
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b:
                by_bytes.setdefault(b, []).append(i)
        self._vocabulary = oc.Vocabulary(vocab.stop_ids[0], by_bytes)
        # Jump-forward probes: per byte value, its single-byte token, or else every token that
        # starts with that byte (empty when no token can produce it: it can never be forced).
        starting: list[list[int]] = [[] for _ in range(256)]
        for b, ids in by_bytes.items():
            if len(b) > 1:
                starting[b[0]].append(ids[0])
        self._byte_probes = tuple(
            (by_bytes[bytes([b])][0], True) if bytes([b]) in by_bytes
            else (tuple(starting[b]), False)
            for b in range(256)
        )

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        import outlines_core as oc

        regex = self.to_regex(constraint)
        try:
            index = oc.Index(regex, self._vocabulary)
        except Exception as e:
            field = "value_type" if constraint.kind == "type" else constraint.kind
            raise ValueError(f"{field}: not supported by the outlines backend: {e}") from None
        return OutlinesCompiled(constraint, self.vocab, index, self._byte_probes,
                                ShortestCompletion(self.token_table))

    def to_regex(self, c: Constraint) -> str:
        """The regex outlines-core compiles for ``c`` (``ValueError`` when unsupported)."""
        if c.kind == "grammar":
            raise ValueError("grammar: Lark grammars are not supported by the outlines backend "
                             "(use the xgrammar backend)")
        if c.kind == "tool_calls":
            raise ValueError("tool_calls: constrained tool calls in free text are not supported "
                             "by the outlines backend (use the xgrammar backend)")
        if c.kind == "regex":
            return strip_anchors(c.spec)
        if c.kind == "type":
            return c.type_regex()
        if c.kind == "choices":
            return "(" + "|".join(regex_escape(s) for s in c.choice_list()) + ")"
        assert c.kind == "json_schema", c.kind
        if c.json_indent is not None:
            raise ValueError("json_indent: indented JSON is not supported by the outlines backend")
        schema = bound_recursion(c.schema())
        check_schema_support(schema, self.name)
        from outlines_core.json_schema import build_regex_from_schema

        try:
            return build_regex_from_schema(json.dumps(schema, ensure_ascii=False),
                                           whitespace_pattern="")
        except Exception as e:
            msg = str(e).strip().splitlines()[0]
            raise ValueError(f"json_schema: not supported by the outlines backend: {msg}") from None


class OutlinesCompiled(CompiledGrammar):
    def __init__(self, constraint: Constraint, vocab: TokenVocab, index, byte_probes,
                 completion: ShortestCompletion):
        self.constraint = constraint
        self.completion = completion
        self.vocab = vocab
        self.index = index
        self.byte_probes = byte_probes
        # Per-automaton-state memos shared by all matchers (idempotent writes: thread-safe).
        self.forced_byte: dict[int, tuple[int, int] | None] = {}  # state -> (byte, next state)
        self.dead_end: dict[int, bool] = {}  # final state -> only EOS can follow

    def new_matcher(self) -> GrammarMatcher:
        return OutlinesMatcher(self)

    def forced_step(self, state: int) -> tuple[int, int] | None:
        """``(byte, next state)`` when exactly one byte can follow ``state`` and the output
        cannot end there; else None. The next byte must be the first byte of an allowed token,
        so probing one token per byte value (tokens starting with it where the vocabulary has no
        single-byte token) finds every possible byte."""
        if state in self.forced_byte:
            return self.forced_byte[state]
        found: list[tuple[int, int | None]] = []
        if not self.index.is_final_state(state):
            for byte, (probe, single) in enumerate(self.byte_probes):
                if single:
                    nxt = self.index.get_next_state(state, probe)
                    hit = nxt is not None
                else:  # only multi-byte tokens start with this byte: no per-byte next state
                    nxt = None
                    hit = any(self.index.get_next_state(state, t) is not None for t in probe)
                if hit:
                    found.append((byte, nxt))
                    if len(found) > 1:
                        break
        step = found[0] if len(found) == 1 and found[0][1] is not None else None
        self.forced_byte[state] = step
        return step


class OutlinesMatcher(GrammarMatcher):
    def __init__(self, compiled: OutlinesCompiled):
        import outlines_core as oc

        self.vocab = compiled.vocab
        self._c = compiled
        self._guide = oc.Guide(compiled.index, max_rollback=MAX_ROLLBACK_TOKENS)
        self._stopped = False
        self._history: list[bool] = []  # per accepted token: True = advanced, False = stop token

    def mask_kernel(self) -> BitmaskKernel:
        return xgrammar_bitmask_kernel   # same layout; ~10x faster on CPU than the torch one

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        out = bitmask[row]
        out.zero_()
        if self._stopped:
            return
        assert out.is_contiguous() and out.dtype == torch.int32 and out.device.type == "cpu"
        self._guide.write_mask_into(out.data_ptr(), out.numel(), 4)
        if self._guide.is_finished():  # the index sets the first stop id; add the others
            for t in self.vocab.stop_ids[1:]:
                out[t // 32] |= _bit(t % 32)

    def accept_token(self, token_id: int) -> bool:
        if self._stopped or not 0 <= token_id < self.vocab.vocab_size:
            return False
        if token_id in self.vocab.stop_ids:
            if not self._guide.is_finished():
                return False
            self._stopped = True
            self._history.append(False)
            return True
        if token_id in self.vocab.special_ids:
            return False
        try:
            self._guide.advance(token_id, return_tokens=False)
        except ValueError:  # no transition: the token is not allowed here
            return False
        self._history.append(True)
        return True

    def is_terminated(self) -> bool:
        if self._stopped:
            return True
        if not self._guide.is_finished():
            return False
        state = self._guide.get_state()
        dead = self._c.dead_end.get(state)
        if dead is None:
            allowed = self._c.index.get_allowed_tokens(state) or []
            dead = all(t in self.vocab.stop_ids for t in allowed)
            self._c.dead_end[state] = dead
        return dead

    def jump_forward_text(self) -> str:
        if self._stopped:
            return ""
        out = bytearray()
        state = self._guide.get_state()
        while len(out) < _MAX_JUMP_BYTES:
            step = self._c.forced_step(state)
            if step is None:
                break
            byte, state = step
            out.append(byte)
        return _whole_chars(bytes(out))

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= len(self._history):
            raise ValueError(
                f"num_tokens: cannot roll back {num_tokens} of {len(self._history)} tokens"
            )
        undone = self._history[len(self._history) - num_tokens:]
        advanced = sum(undone)
        if advanced > self._guide.get_allowed_rollback():
            raise ValueError(f"num_tokens: rollback limit is {MAX_ROLLBACK_TOKENS} tokens")
        del self._history[len(self._history) - num_tokens:]
        if advanced:
            self._guide.rollback_state(advanced)
        if False in undone:
            self._stopped = False

    @property
    def num_accepted(self) -> int:
        return len(self._history)

    def can_end(self) -> bool:
        return not self._stopped and self._guide.is_finished()

    def state_key(self) -> tuple[int, bool]:
        return self._guide.get_state(), self._stopped


def _bit(i: int) -> int:
    """Bit ``i`` of an int32 word as a Python int in int32 range."""
    return -(1 << 31) if i == 31 else 1 << i


def _whole_chars(data: bytes) -> str:
    """The longest prefix of ``data`` made of complete UTF-8 characters ('' if it starts inside
    a character)."""
    if data and 0x80 <= data[0] < 0xC0:
        return ""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""
