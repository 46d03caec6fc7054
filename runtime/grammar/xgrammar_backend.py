"""xgrammar backend (default): every constraint kind, Lark grammars via :mod:`lark_ebnf`.

JSON is compact (``{"a":1,"b":[2,3]}``, no whitespace anywhere) unless the constraint has a
``json_indent``, then pretty-printed with that indent and ``", "`` / ``": "`` separators.
Recursive schemas are bounded to depth 3 (:mod:`schema_unroll`), and schemas using keywords or
keyword combinations xgrammar would not enforce are refused (:mod:`schema_support`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import torch

from agentlang.runtime.grammar.base import (
    BitmaskKernel,
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    bitmask_width,
    ids_to_bitmask_row,
)
from agentlang.runtime.grammar.completion import ShortestCompletion
from agentlang.runtime.grammar.token_table import TokenTable
from agentlang.runtime.grammar.constraints import TOOL_CALL_TRIGGER, Constraint
from agentlang.runtime.grammar.lark_ebnf import lark_to_ebnf
from agentlang.runtime.grammar.regex_ebnf import ebnf_string
from agentlang.runtime.grammar.schema_support import check_schema_support
from agentlang.runtime.quant.native import qmatmul_library
from agentlang.runtime.grammar.schema_unroll import bound_recursion
from agentlang.runtime.grammar.vocab import TokenVocab
from agentlang.runtime.grammar.tool_format import FORMATS, after_reasoning, structural_tag

DEBUG_STATE = "_debug_print_internal_state"
_STEPS = re.compile(r"There are (\d+) steps")
_ITEM = re.compile(r"rule_id=(\d+), sequence_id=(\d+), element_id=(\d+), "
                   r"rule_start_pos=(-?\d+), sub_element_id=(\d+)")
_FIELD = {"json_schema": "json_schema", "regex": "regex", "choices": "choices",
          "grammar": "grammar", "type": "value_type", "tool_calls": "tool_calls"}


def decoded_vocab(tokenizer, vocab_size: int) -> list[bytes]:
    """Every token of a Hugging Face tokenizer as raw bytes (``vocab_size`` entries; byte-level
    BPE, SentencePiece byte fallback and raw vocabularies), by xgrammar's decoder."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    return list(info.decoded_vocab)


def xgrammar_bitmask_kernel(logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int,
                            rows: Sequence[int] | None) -> None:
    """xgrammar's :data:`~agentlang.runtime.grammar.base.BitmaskKernel` (CPU, or CUDA/Triton on
    GPU). float32 CPU logits (rows of unit stride) take the native library's kernel where it
    runs instead: the same result (``sample.c``), ~5 us a row at 49k tokens vs ~105 us."""
    native = qmatmul_library() if logits.device.type == "cpu" else None
    if native is not None and logits.dtype == torch.float32 and logits.stride(-1) == 1:
        native.apply_bitmask(logits, bitmask, vocab_size, rows)
        return
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab_size,
                                    indices=None if rows is None else list(rows))


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(self, vocab: TokenVocab, max_threads: int = 2):
        import xgrammar as xgr

        self.vocab = vocab
        self.token_table = TokenTable(vocab)
        info = xgr.TokenizerInfo(
            list(vocab.token_bytes),
            xgr.VocabType.RAW,
            vocab_size=vocab.vocab_size,
            stop_token_ids=list(vocab.stop_ids),
        )
        assert set(info.special_token_ids) == set(vocab.special_ids), "special ids disagree"
        # Our GrammarCache does the (bounded) caching; xgrammar's own cache would be unbounded.
        self._compiler = xgr.GrammarCompiler(info, max_threads=max_threads, cache_enabled=False)

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        field = _FIELD[constraint.kind]
        try:
            closers = FORMATS[constraint.call_format()[0]].closers \
                if constraint.kind == "tool_calls" else ()
            return XGrammarCompiled(constraint, self.vocab, self._compile(constraint),
                                    ShortestCompletion(self.token_table, closers=closers))
        except ValueError as e:
            if str(e).startswith(field + ":"):
                raise
            raise ValueError(f"{field}: not supported by the xgrammar backend: {e}") from None
        except RuntimeError as e:  # xgrammar reports every conversion failure as RuntimeError
            msg = str(e).strip().splitlines()
            raise ValueError(
                f"{field}: not supported by the xgrammar backend: {msg[-1] if msg else e!r}"
            ) from None

    def _compile(self, c: Constraint):
        if c.kind == "json_schema" and c.reasoning:
            import xgrammar as xgr

            schema = bound_recursion(c.schema())
            check_schema_support(schema, self.name)
            tag = {"type": "structural_tag", "format": after_reasoning(
                {"type": "json_schema", "json_schema": schema}, c.reasoning)}
            return self._compiler.compile_grammar(xgr.Grammar.from_structural_tag(json.dumps(tag)))
        if c.kind == "json_schema":
            schema = bound_recursion(c.schema())
            check_schema_support(schema, self.name)
            spec = json.dumps(schema, ensure_ascii=False)
            if c.json_indent is None:
                return self._compiler.compile_json_schema(
                    spec, any_whitespace=False, separators=(",", ":"), strict_mode=True
                )
            return self._compiler.compile_json_schema(
                spec, any_whitespace=False, indent=c.json_indent, strict_mode=True
            )
        if c.kind == "regex":
            return self._compiler.compile_regex(c.spec)
        if c.kind == "type":
            return self._compiler.compile_regex(c.type_regex())
        if c.kind == "choices":
            alts = " | ".join(f"({ebnf_string(s)})" for s in c.choice_list())
            return self._compiler.compile_grammar(f"root ::= {alts}\n")
        if c.kind == "tool_calls" and (c.call_format() != ("agentlang", False) or c.reasoning):
            import xgrammar as xgr

            fmt, forced = c.call_format()
            tag = structural_tag(fmt, c.tools(), forced, c.reasoning, bound_recursion)
            return self._compiler.compile_grammar(xgr.Grammar.from_structural_tag(json.dumps(tag)))
        if c.kind == "tool_calls":
            import xgrammar as xgr

            tags = [xgr.StructuralTagItem(
                begin=f'{TOOL_CALL_TRIGGER}{{"name": {json.dumps(t["name"])}, "arguments": ',
                schema=json.dumps(bound_recursion(t["parameters"])), end="}</tool_call>")
                for t in c.tools()]
            return self._compiler.compile_structural_tag(tags, [TOOL_CALL_TRIGGER])
        assert c.kind == "grammar", c.kind
        return self._compiler.compile_grammar(lark_to_ebnf(c.spec))


class XGrammarCompiled(CompiledGrammar):
    def __init__(self, constraint: Constraint, vocab: TokenVocab, compiled,
                 completion: ShortestCompletion):
        self.constraint = constraint
        self.completion = completion
        self.vocab = vocab
        self._compiled = compiled
        self._not_stop = ~ids_to_bitmask_row(vocab.stop_ids, vocab.vocab_size)  # [W] int32

    def new_matcher(self) -> GrammarMatcher:
        return XGrammarMatcher(self._compiled, self.vocab, self._not_stop)


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, compiled, vocab: TokenVocab, not_stop: torch.Tensor):
        import xgrammar as xgr

        self.vocab = vocab
        self._not_stop = not_stop
        self._m = xgr.GrammarMatcher(compiled)
        self._accepted = 0
        self._version = 0  # bumps on every state change; keys the is_terminated cache
        self._final_cache: tuple[int, bool] = (-1, False)

    def mask_kernel(self) -> BitmaskKernel:
        return xgrammar_bitmask_kernel

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._m.is_terminated():
            bitmask[row].zero_()
            return
        self._m.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        if not 0 <= token_id < self.vocab.vocab_size or self._m.is_terminated():
            return False
        if not self._m.accept_token(token_id):
            return False
        self._accepted += 1
        self._version += 1
        return True

    def is_terminated(self) -> bool:
        if self._m.is_terminated():
            return True
        if not self._m.is_completed():
            return False
        if self._final_cache[0] != self._version:  # complete: can anything but EOS follow?
            row = torch.zeros(1, bitmask_width(self.vocab.vocab_size), dtype=torch.int32)
            self._m.fill_next_token_bitmask(row, 0)
            self._final_cache = (self._version, not bool((row[0] & self._not_stop).any()))
        return self._final_cache[1]

    def jump_forward_text(self) -> str:
        if self._m.is_terminated():
            return ""
        return self._m.find_jump_forward_string()

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self._accepted:
            raise ValueError(f"num_tokens: cannot roll back {num_tokens} of {self._accepted} tokens")
        if num_tokens:
            self._m.rollback(num_tokens)
            self._accepted -= num_tokens
            self._version += 1

    @property
    def num_accepted(self) -> int:
        return self._accepted

    def can_end(self) -> bool:
        return not self._m.is_terminated() and self._m.is_completed()

    def state_key(self) -> tuple:
        """The parser items of the last step with start positions made relative: inexact,
        items further down the parser stack are not part of it."""
        pos, items = self.parser_items()
        return self._m.is_terminated(), tuple((r, s, e, pos - p, u) for r, s, e, p, u in items)

    def parser_items(self) -> tuple[int, tuple[tuple[int, int, int, int, int], ...]]:
        # xgrammar (0.2.9) exposes no state id or parser items publicly; its debug dump of the
        # last step is the only view. A third-party method, named here once (DEBUG_STATE).
        text = getattr(self._m, DEBUG_STATE)()
        steps = int(_STEPS.search(text).group(1))
        return steps - 1, tuple(tuple(map(int, item)) for item in _ITEM.findall(text))
