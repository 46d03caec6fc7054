"""Speculation over HTTP: the ``speculative`` field of the OpenAI routes (the official client's
``extra_body``), its accepted / rejected drafts in ``usage.completion_tokens_details`` (as
OpenAI reports predicted outputs), SGLang's ``meta_info.spec_verify_ct``, the ``/metrics``
counters, streamed chunks of several tokens, outputs identical on and off, and a bad value
refused naming the field."""

from __future__ import annotations

import json

import pytest
from server_harness import metrics

pytestmark = pytest.mark.slow

COPY = ("Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps "
        "over the lazy dog, the quick brown fox jumps over the lazy dog, the quick brown fox")


def complete(client, **extra):
    return client.completions.create(model="default", prompt=COPY, max_tokens=48,
                                     temperature=0, extra_body={"ignore_eos": True, **extra})


def test_on_off_identical_and_reported(client, http):
    before = metrics(http)
    off = complete(client, speculative=False)
    on = complete(client, speculative=True)
    assert on.choices[0].text == off.choices[0].text
    details = on.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens >= 0
    assert off.usage.completion_tokens_details is None         # no draft: nothing reported
    after = metrics(http)
    assert after["agentlang_spec_accepted_tokens_total"] - \
        before["agentlang_spec_accepted_tokens_total"] == details.accepted_prediction_tokens
    assert after["agentlang_spec_draft_tokens_total"] > before["agentlang_spec_draft_tokens_total"]
    # the draft policy's row cost, measured on this machine at the first draft (not 0.35)
    assert 0.02 <= after["agentlang_speculative_row_cost"] <= 1
    assert after["agentlang_speculative_row_cost"] != 0.35


def test_streamed_chunks_carry_several_tokens(http):
    body = {"model": "default", "prompt": COPY, "max_tokens": 48, "temperature": 0,
            "ignore_eos": True, "speculative": True, "stream": True,
            "stream_options": {"include_usage": True}}
    texts = []
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                texts += [c["text"] for c in chunk.get("choices", []) if c.get("text")]
    del body["stream_options"]
    whole = http.post("/v1/completions", json={**body, "stream": False}).json()
    assert "".join(texts) == whole["choices"][0]["text"]
    assert len(texts) < whole["usage"]["completion_tokens"]   # a chunk held several tokens


def test_sglang_meta_info_counts_verify_steps(http):
    r = http.post("/generate", json={"text": COPY, "sampling_params": {
        "max_new_tokens": 32, "temperature": 0, "ignore_eos": True}})
    assert "spec_verify_ct" not in r.json()["meta_info"]     # the server default: off
    r = http.post("/v1/completions", json={"model": "default", "prompt": COPY, "max_tokens": 8,
                                           "speculative": "yes"})
    assert r.status_code == 400
    assert "speculative" in r.text
