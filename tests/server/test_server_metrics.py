"""``/metrics`` (parsed with prometheus_client's parser), the prefix-cache hit rate moving, and a
client that disconnects mid-stream giving its pages back."""

from __future__ import annotations

import time

import httpx
import pytest
from server_harness import metrics, pages_after_flush, wait_idle

pytestmark = pytest.mark.slow

REPEATED = ("A shared instruction block that many agents send before their own question, "
            "long enough to fill several KV pages of sixteen tokens each. ") * 3


def test_metrics_parse_and_hit_rate_moves(http):
    before = metrics(http)
    for name in ("agentlang_num_requests_running", "agentlang_num_requests_waiting",
                 "agentlang_kv_pages_used", "agentlang_kv_pages_total",
                 "agentlang_prefix_cache_hit_rate", "agentlang_preemptions_total",
                 "agentlang_cow_copies_total", "agentlang_prompt_tokens_total",
                 "agentlang_generation_tokens_total",
                 "agentlang_time_to_first_token_seconds_count",
                 "agentlang_e2e_request_latency_seconds_count",
                 "agentlang_live_programs", "agentlang_live_program_limit",
                 "agentlang_live_limit_lowered_total"):
        assert name in before, name
    assert before["agentlang_live_programs"] == 0                 # the default policy: no gate
    body = {"text": REPEATED + "Question 1?", "sampling_params": {"max_new_tokens": 2}}
    for i in range(3):
        body["text"] = REPEATED + f"Question {i}?"
        assert http.post("/generate", json=body).status_code == 200
    after = metrics(http)
    assert after["agentlang_prefix_cache_hit_tokens_total"] >= \
        before["agentlang_prefix_cache_hit_tokens_total"] + 2 * 48
    assert after["agentlang_prefix_cache_hit_rate"] != before["agentlang_prefix_cache_hit_rate"]
    assert after["agentlang_prompt_tokens_total"] > before["agentlang_prompt_tokens_total"]
    assert after["agentlang_generation_tokens_total"] >= \
        before["agentlang_generation_tokens_total"] + 6
    assert after["agentlang_time_to_first_token_seconds_count"] == \
        before["agentlang_time_to_first_token_seconds_count"] + 3
    assert after["agentlang_e2e_request_latency_seconds_count"] == \
        before["agentlang_e2e_request_latency_seconds_count"] + 3
    key = "agentlang_http_requests_total[('endpoint', 'generate'), ('outcome', 'ok')]"
    assert after[key] >= 3


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": "default", "stream": True, "max_tokens": 900,
                              "ignore_eos": True,
                              "messages": [{"role": "user", "content": "Tell a long story."}]}),
    ("/generate", {"text": "Once upon a time", "stream": True,
                   "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}),
])
def test_disconnect_mid_stream_frees_pages(server, http, path, body):
    baseline = pages_after_flush(http)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            events = 0
            samples = []
            for line in r.iter_lines():
                events += line.startswith("data:")
                if events >= 3:
                    # the request is live while its stream is being read (sampled before
                    # leaving the loop: leaving it may already close the connection, and the
                    # abort then races these reads; metrics are read without the step lock)
                    samples = [metrics(http) for _ in range(5)]
                    break
            assert any(m["agentlang_num_requests_running"] + m["agentlang_num_requests_waiting"]
                       == 1 for m in samples), samples[-1:]
    # 900 tokens take a minute or more on this CPU: an idle engine within seconds means the
    # disconnect aborted the request
    t0 = time.monotonic()
    m = wait_idle(http, timeout=15)
    assert time.monotonic() - t0 < 15 and m["agentlang_generation_tokens_total"] > 0
    assert pages_after_flush(http) == baseline


def test_disconnect_while_waiting_non_streaming(server, http):
    baseline = pages_after_flush(http)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/completions", timeout=1.5, json={
            "model": "default", "prompt": "Once upon a time", "max_tokens": 900,
            "ignore_eos": True})
    wait_idle(http, timeout=15)
    assert pages_after_flush(http) == baseline
