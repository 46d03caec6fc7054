"""The native API (``/generate`` and friends) against the real server, plus the DSL's
``RuntimeEndpoint`` backend talking to it."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


def test_generate_text_meta_and_logprobs(http):
    r = http.post("/generate", json={
        "text": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True})
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == 5 and meta["completion_tokens"] == len(out["output_ids"]) == 4
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["cached_tokens"] >= 0 and meta["e2e_latency"] > 0
    chosen = meta["output_token_logprobs"]
    assert [t[1] for t in chosen] == out["output_ids"]
    assert "".join(t[2] for t in chosen) == out["text"]
    for (lp, tid, _), top in zip(chosen, meta["output_top_logprobs"]):
        assert len(top) == 2 and top[0][1] == tid and abs(top[0][0] - lp) < 1e-5  # greedy
    assert meta["input_token_logprobs"] == [] and meta["input_top_logprobs"] == []
    r = http.post("/generate", json={
        "text": PROMPT, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True, "logprob_start_len": 0})
    inputs = r.json()["meta_info"]["input_token_logprobs"]
    assert len(inputs) == 5 and inputs[0][0] is None and all(x[0] < 0 for x in inputs[1:])
    assert all(x[2] is None for x in inputs)        # text only with return_text_in_logprobs


def test_generate_stream_is_cumulative_and_ends_with_done(http):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    plain = http.post("/generate", json=body).json()
    events = []
    with http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(ln[5:]) for ln in lines[:-1]]
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert events[-1]["text"] == plain["text"] and events[-1]["output_ids"] == plain["output_ids"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_generate_batch_ids_and_n(http):
    ids = http.post("/tokenize", json={"text": PROMPT}).json()["tokens"]
    r = http.post("/generate", json={"input_ids": [ids, ids],
                                     "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    a, b = r.json()
    assert a["text"] == b["text"] and a["meta_info"]["prompt_tokens"] == len(ids)
    r = http.post("/generate", json={"text": PROMPT, "sampling_params": {
        "max_new_tokens": 3, "temperature": 1.0, "n": 3, "sampling_seed": 5}})
    outs = r.json()
    assert [o["index"] for o in outs] == [0, 1, 2]


def test_generate_constraint_and_stop(http):
    r = http.post("/generate", json={"text": "Is water wet? Answer:", "sampling_params": {
        "max_new_tokens": 5, "temperature": 0, "regex": "( yes| no)"}})
    assert r.json()["text"] in (" yes", " no")
    r = http.post("/generate", json={"text": "Count: 1, 2, 3,", "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "stop": [","]}})
    meta = r.json()["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": ","}


def test_score_matches_generate_logprob(http):
    scored = http.post("/score", json={"prefix": PROMPT, "continuations": [" Paris", " Rome"]})
    paris, rome = scored.json()["logprobs"]
    gen = http.post("/generate", json={"text": PROMPT, "return_logprob": True,
                                       "return_text_in_logprobs": True,
                                       "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    lp, tid, text = gen.json()["meta_info"]["output_token_logprobs"][0]
    assert text == " Paris" and abs(paris[0] - lp) < 1e-3 and paris[0] > rome[0]


def test_cache_prefix_release_and_model_info(http):
    info = http.get("/get_model_info").json()
    assert info["model_name"] == "SmolLM2-135M-Instruct" and info["page_size"] == 16
    pool = info["kv_pool"]
    assert pool["bytes_per_token"] == 30 * 2 * 3 * 64 * 4
    assert pool["capacity_tokens"] == pool["num_pages"] * 16
    text = "You are a meticulous assistant who answers in short sentences. " * 4
    h = http.post("/cache_prefix", json={"text": text}).json()
    assert h["tokens"] > 32
    r = http.post("/generate", json={"text": text + "Hello", "sampling_params": {"max_new_tokens": 1}})
    assert r.json()["meta_info"]["cached_tokens"] >= 32
    assert http.post("/release_prefix", json={"handle": h["handle"]}).status_code == 200
    again = http.post("/release_prefix", json={"handle": h["handle"]})
    assert again.status_code == 400 and again.json()["error"]["param"] == "handle"


def test_chat_template_tokenize_detokenize(http):
    msgs = [{"role": "user", "content": "hi"}]
    text = http.post("/apply_chat_template", json={"messages": msgs}).json()["text"]
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    tok = http.post("/tokenize", json={"messages": msgs}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] > 0
    back = http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["text"]
    assert back == text


def test_dsl_runtime_endpoint_against_the_server(server):
    import agentlang as al

    @al.function
    def prog(s):
        s += "Q: Is the sky blue? Answer yes or no.\nA:" + al.select("a", [" yes", " no"])
        s += "\nWhy?" + al.gen("why", max_tokens=4, temperature=0)

    backend = al.RuntimeEndpoint(server.url)
    try:
        st = prog.run(backend=backend)
        assert st["a"] in (" yes", " no") and isinstance(st["why"], str)
        assert st.get_meta_info("why")["completion_tokens"] <= 4
    finally:
        backend.close()
