"""SGLang's ``/generate`` on the real server: parameter names and defaults against SGLang's own
source, bad input (400 naming the field; one bad batch element rejects the whole batch with
nothing queued), prefill-only requests into the radix cache, input logprobs as SGLang's
``select`` reads them, abort and concate-and-append."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
from server_harness import metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import sglang_source  # noqa: E402

pytestmark = pytest.mark.slow

LONG = "You are a careful assistant. Answer every question in one short sentence. " * 4


def test_sampling_names_and_defaults_are_sglangs():
    if not sglang_source.installed():
        pytest.skip("the sglang frontend is installed by `make install`")
    from agentlang.runtime.server.sglang.params import DEFAULTS

    theirs = sglang_source.sampling_fields()
    assert set(DEFAULTS) == set(theirs)
    for name, default in theirs.items():
        if default is not ...:
            assert DEFAULTS[name] == default, name


def _sp(**fields):
    return {"text": "Hello", "sampling_params": fields}


BAD = [
    ("temperature-type", _sp(temperature="hot"), "sampling_params.temperature"),
    ("temperature-negative", _sp(temperature=-1), "sampling_params.temperature"),
    ("top-k-zero", _sp(top_k=0), "sampling_params.top_k"),
    ("top-p-zero", _sp(top_p=0), "sampling_params.top_p"),
    ("min-p-big", _sp(min_p=1.5), "sampling_params.min_p"),
    ("repetition-penalty", _sp(repetition_penalty=3), "sampling_params.repetition_penalty"),
    ("presence-penalty", _sp(presence_penalty=-3), "sampling_params.presence_penalty"),
    ("min-over-max", _sp(max_new_tokens=2, min_new_tokens=5), "sampling_params.min_new_tokens"),
    ("max-new-float", _sp(max_new_tokens=2.5), "sampling_params.max_new_tokens"),
    ("max-new-beyond-context", _sp(max_new_tokens=100000), "sampling_params.max_new_tokens"),
    ("n-zero", _sp(n=0), "sampling_params.n"),
    ("stop-int", _sp(stop=5), "sampling_params.stop"),
    ("stop-too-many", _sp(stop=[str(i) for i in range(33)]), "sampling_params.stop"),
    ("stop-token-out-of-vocab", _sp(stop_token_ids=[10**9]), "sampling_params.stop_token_ids"),
    ("ignore-eos-type", _sp(ignore_eos="yes"), "sampling_params.ignore_eos"),
    ("seed-type", _sp(sampling_seed="1"), "sampling_params.sampling_seed"),
    ("two-constraints", _sp(regex="a+", json_schema='{"type": "string"}'), "sampling_params"),
    ("schema-not-json", _sp(json_schema="{nope"), "sampling_params.json_schema"),
    ("bad-regex", _sp(regex="("), "sampling_params.regex"),
    ("bad-regex-prefill-only", _sp(regex="(", max_new_tokens=0), "sampling_params.regex"),
    ("unknown-field", _sp(max_tokens=3), "sampling_params.max_tokens"),
    ("params-not-object", {"text": "x", "sampling_params": 3}, "sampling_params"),
    ("return-logprob-type", {"text": "x", "return_logprob": "yes"}, "return_logprob"),
    ("start-past-prompt", {"text": "x", "return_logprob": True, "logprob_start_len": 99},
     "logprob_start_len"),
    ("top-logprobs-negative", {"text": "x", "return_logprob": True, "top_logprobs_num": -1},
     "top_logprobs_num"),
    ("rid-type", {"text": "x", "rid": 5}, "rid"),
    ("image-data", {"text": "x", "image_data": "a.png"}, "image_data"),
    ("text-and-ids", {"text": "x", "input_ids": [1]}, "text"),
    ("empty-text", {"text": ""}, "text"),
    ("batch-params-count", {"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ("stream-type", {"text": "x", "stream": "yes"}, "stream"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_a_400_naming_the_field(http, case):
    _, body, param = case
    r = http.post("/generate", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param.split(".")[0].split("[")[0] in err["message"], err


def test_one_bad_batch_element_rejects_the_batch_with_nothing_queued(http):
    before = metrics(http)["agentlang_prompt_tokens_total"]
    r = http.post("/generate", json={"text": ["One", "Two", "Three"], "sampling_params": [
        {"max_new_tokens": 2}, {"max_new_tokens": 2, "top_p": 5}, {"max_new_tokens": 2}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params[1].top_p"
    r = http.post("/generate", json={"input_ids": [[1, 2], [3, 10**9]],
                                     "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_ids[1]"
    assert metrics(http)["agentlang_prompt_tokens_total"] == before


def test_defaults_and_null_values(http):
    r = http.post("/generate", json={"text": "Hello", "sampling_params": {
        "max_new_tokens": 3, "temperature": None, "top_k": None, "stop": None,
        "json_schema": None, "stop_regex": [], "stop_token_ids": []}})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] <= 3


def test_prefill_only_fills_the_radix_cache(http):
    http.post("/flush_cache").raise_for_status()
    ids = http.post("/tokenize", json={"text": LONG}).json()["tokens"]
    r = http.post("/generate", json={"text": LONG, "sampling_params": {"max_new_tokens": 0}})
    out = r.json()
    assert out["text"] == "" and out["output_ids"] == []
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    assert meta["completion_tokens"] == 0 and meta["prompt_tokens"] == len(ids)
    again = http.post("/generate", json={"text": LONG + "Why?",
                                         "sampling_params": {"max_new_tokens": 1}}).json()
    assert again["meta_info"]["cached_tokens"] >= (len(ids) // 16) * 16 - 16 > 0
    # a constraint with max_new_tokens 0: compiled and checked, not applied
    r = http.post("/generate", json={"text": LONG, "sampling_params": {
        "max_new_tokens": 0, "regex": "[0-9]+"}})
    assert r.status_code == 200 and r.json()["text"] == ""


def test_input_logprobs_as_sglangs_select_reads_them(http):
    text = "The capital of France is Paris"
    p = http.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 0}})
    n = p.json()["meta_info"]["prompt_tokens"]
    full = http.post("/generate", json={
        "text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True, "logprob_start_len": 0}).json()["meta_info"]
    start = max(n - 2, 0)
    sel = http.post("/generate", json={
        "text": [text, text + "!"], "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": start})
    a, b = sel.json()
    itl = a["meta_info"]["input_token_logprobs"]
    assert len(itl) == n - start and itl[0][0] is None
    for (lp, tid, tok), (ref_lp, ref_tid, _) in zip(itl[1:], full["input_token_logprobs"][start + 1:]):
        assert tid == ref_tid and abs(lp - ref_lp) < 1e-4 and isinstance(tok, str)
    assert a["meta_info"]["output_token_logprobs"] == []
    assert len(b["meta_info"]["input_token_logprobs"]) > len(itl)
    plain = http.post("/generate", json={"text": text, "return_logprob": True,
                                         "sampling_params": {"max_new_tokens": 0}})
    assert plain.json()["meta_info"]["input_token_logprobs"] == []     # no start given


def test_cache_salt_separates_prefix_cache_namespaces(http):
    body = {"text": LONG + "Salted?", "sampling_params": {"max_new_tokens": 1}}
    http.post("/generate", json={**body, "cache_salt": "tenant-a"}).raise_for_status()
    same = http.post("/generate", json={**body, "cache_salt": "tenant-a"}).json()
    other = http.post("/generate", json={**body, "cache_salt": "tenant-b"}).json()
    assert same["meta_info"]["cached_tokens"] > 0 and other["meta_info"]["cached_tokens"] == 0
    r = http.post("/generate", json={**body, "cache_salt": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_batch_rids_and_broadcast(http):
    r = http.post("/generate", json={"text": ["One", "Two"], "rid": "batch",
                                     "sampling_params": {"max_new_tokens": 1}})
    assert [o["meta_info"]["id"] for o in r.json()] == ["batch_0", "batch_1"]
    r = http.post("/generate", json={"text": ["One", "Two"], "rid": ["x1", "x2"],
                                     "return_logprob": [True, False],
                                     "sampling_params": [{"max_new_tokens": 1},
                                                         {"max_new_tokens": 2}]})
    x1, x2 = r.json()
    assert "output_token_logprobs" in x1["meta_info"]
    assert "output_token_logprobs" not in x2["meta_info"]


def test_abort_request_and_concate_and_append(http, server):
    import httpx

    events = []

    def consume():
        with httpx.Client(base_url=server.url, timeout=120) as c:
            with c.stream("POST", "/generate", json={
                    "text": "Tell a long story.", "rid": "to-abort", "stream": True,
                    "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}) as r:
                events.extend(ln for ln in r.iter_lines() if ln.startswith("data:"))

    t = threading.Thread(target=consume)
    t.start()
    deadline = time.monotonic() + 60
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert http.post("/abort_request", json={"rid": "to-abort"}).status_code == 200
    t.join(60)
    assert not t.is_alive() and events[-1] == "data: [DONE]"
    last = json.loads(events[-2][5:])
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 500
    r = http.post("/concate_and_append_request", json={"src_rids": ["a", "b"], "dst_rid": "c"})
    assert r.status_code == 200
    assert http.post("/abort_request", json={"rid": "never-existed"}).status_code == 200
