"""Structured generation: constraints, grammar backends, compiled-grammar cache, batch masks,
jump-forward drafts. See :mod:`agentlang.runtime.grammar.base` for the matcher contract; one sampling step
under a constraint is :mod:`agentlang.runtime.engine.constrained_step`."""

from agentlang.runtime.grammar.base import (
    BACKENDS,
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    bitmask_width,
    make_grammar_backend,
)
from agentlang.runtime.grammar.cache import GrammarCache
from agentlang.runtime.grammar.constraints import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    Constraint,
    constraint_from_params,
)
from agentlang.runtime.grammar.jump_forward import JumpForward, draft_tokens, jump_forward
from agentlang.runtime.grammar.mask import (
    FilledBitmask,
    apply_grammar_bitmask,
    apply_grammar_masks,
    fill_grammar_bitmask,
)

__all__ = [
    "BACKENDS", "CompiledGrammar", "Constraint", "FilledBitmask", "GrammarBackend",
    "GrammarCache", "GrammarMatcher", "JumpForward", "REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT",
    "REGEX_STR", "apply_grammar_bitmask", "apply_grammar_masks", "bitmask_width",
    "constraint_from_params", "draft_tokens", "fill_grammar_bitmask", "jump_forward",
    "make_grammar_backend",
]
