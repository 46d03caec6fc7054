"""Every leaf node kind of the IR has its method in every pass (one dispatch,
``agentlang.ir.handler``): adding a node and forgetting a pass fails here, and at run time the
pass raises ``TypeError`` naming the missing method."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import ClassVar

import pytest

import agentlang as al
from agentlang.interpreter import Interpreter, JoinItem
from agentlang.ir import Expr, Text, handler, leaf_kinds
from agentlang.tracer import TraceStream


def test_every_leaf_kind_has_a_visit_and_a_trace():
    kinds = {k: c for k, c in leaf_kinds().items() if c.__module__.startswith("agentlang.")}
    assert {"text", "gen", "select", "role_begin", "role_end", "var_scope_begin",
            "var_scope_end", "tool_call", "agent_loop"} <= set(kinds)
    for kind in kinds:
        assert callable(getattr(Interpreter, f"visit_{kind}", None)), kind
        if kind != Text.kind:      # text runs are traced with their placeholders, as a fill
            assert callable(getattr(TraceStream, f"trace_{kind}", None)), kind
    assert callable(getattr(Interpreter, f"visit_{JoinItem.kind}"))


def test_a_new_node_without_its_methods_fails_loudly():
    @dataclass(frozen=True)
    class Shout(Expr):
        kind: ClassVar[str] = "shout"
        text: str

    @al.function
    def prog(s):
        s += Shout("hi")

    try:
        assert leaf_kinds()["shout"] is Shout          # found without registering anywhere
        with pytest.raises(TypeError, match="Interpreter cannot handle a Shout node .*visit_shout"):
            Interpreter(stream=None).execute(Shout("hi"))
        assert handler(object(), "_check_", Shout("hi"), optional=True) is None
        with pytest.raises(al.ir.TraceError, match="trace_shout"):
            prog.trace()
    finally:
        del Shout, prog
        gc.collect()
