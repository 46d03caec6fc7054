"""The sampling-parameter table (``agentlang.runtime.sampling.fields``) is the one owner of the
ranges: a bound changed in the table moves every surface — the engine's ``SamplingParams``, the
DSL's ``gen()``, the OpenAI routes, SGLang's ``/generate`` and ``/openapi.json``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from agentlang.runtime.sampling.fields import BOUNDS, SGLANG_NAMES, Bound, sglang_bound, to_engine, to_sglang

# Run in a fresh interpreter: the table is patched before any surface is imported (the request
# models read it when they are defined), so nothing else in this test session sees the change.
PROBE = textwrap.dedent("""
    import dataclasses, json, sys, types
    import agentlang.runtime.sampling.fields as table

    table.BOUNDS = types.MappingProxyType(
        {**table.BOUNDS, "top_p": dataclasses.replace(table.BOUNDS["top_p"], high=HIGH)})

    import agentlang as al
    from agentlang.runtime import Engine, SamplingParams
    from agentlang.runtime.server.app import create_app
    from fastapi.testclient import TestClient

    def error(fn):
        try:
            fn()
        except ValueError as e:
            return str(e)
        return None

    out = {"engine": error(lambda: SamplingParams(top_p=0.7)),
           "engine_ok": error(lambda: SamplingParams(top_p=HIGH)),
           "dsl": error(lambda: al.gen("x", top_p=0.7))}
    client = TestClient(create_app(Engine(max_running=2)))
    chat = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "top_p": 0.7})
    text = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "top_p": 0.7})
    native = client.post("/generate", json={
        "text": "hi", "sampling_params": {"max_new_tokens": 1, "top_p": 0.7}})
    ok = client.post("/generate", json={
        "text": "hi", "sampling_params": {"max_new_tokens": 1, "top_p": HIGH}})
    out.update({name: [r.status_code, r.json().get("error", {}).get("param")]
                for name, r in (("chat", chat), ("completions", text), ("native", native))})
    out["native_ok"] = ok.status_code
    doc = client.get("/openapi.json").json()["components"]["schemas"]
    out["openapi_chat"] = doc["ChatCompletionRequest"]["properties"]["top_p"]
    out["openapi_native"] = doc["GenerateRequest"]["properties"]["sampling_params"]
    print(json.dumps(out))
""")


def _find(node, key):
    """Every value under ``key`` anywhere in a JSON document."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from _find(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _find(v, key)


@pytest.mark.parametrize("high", [0.5, 1.0])
def test_a_bound_changed_in_the_table_moves_every_surface(high):
    done = subprocess.run([sys.executable, "-c", PROBE.replace("HIGH", repr(high))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if high == 0.5:     # 0.7 is now out of range everywhere
        assert out["engine"] == "top_p: must be in (0, 0.5], got 0.7"
        assert out["dsl"] == "top_p: must be in (0, 0.5], got 0.7"
        assert out["chat"] == [400, "top_p"] and out["completions"] == [400, "top_p"]
        assert out["native"] == [400, "sampling_params.top_p"]
    else:               # the unchanged table accepts it: the probe itself can tell
        assert out["engine"] is None and out["dsl"] is None
        assert out["chat"] == out["completions"] == out["native"] == [200, None]
    assert out["engine_ok"] is None and out["native_ok"] == 200
    chat_max = list(_find(out["openapi_chat"], "maximum"))
    assert chat_max == [high], out["openapi_chat"]
    native_top_p = [s for s in _find(out["openapi_native"], "top_p")]
    assert native_top_p and high in list(_find(native_top_p, "maximum")), native_top_p


def test_bounds_speak_json_schema_pydantic_and_text_alike():
    top_k = BOUNDS["top_k"]
    assert [v for v in (-2, -1, 0, 1, 5, 1.5, True) if top_k.accepts(v)] == [-1, 0, 1, 5]
    assert sglang_bound("top_k").accepts(0) is False          # SGLang's verify refuses 0
    assert top_k.pydantic() == {"ge": -1}
    assert BOUNDS["top_p"].json_schema() == {"type": "number", "exclusiveMinimum": 0,
                                             "maximum": 1}
    assert BOUNDS["top_p"].text() == "in (0, 1]"
    assert Bound(False, low=0).accepts(float("inf")) is False  # finite numbers only
    assert sglang_bound("max_new_tokens").accepts(0) and not BOUNDS["max_tokens"].accepts(0)


def test_sglang_names_rename_both_ways():
    for theirs, ours in SGLANG_NAMES.items():
        assert to_engine(theirs) == ours and to_sglang(ours) == theirs
    assert to_engine("top_p") == to_sglang("top_p") == "top_p"
