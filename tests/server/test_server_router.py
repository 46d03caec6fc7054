"""Scale-out: two ``agentlang serve`` replicas behind ``sglang-router`` (cache-aware), all real
processes on free loopback ports (``tests/support/cluster.py``).

The router's worker discovery finds every replica with its model id and metadata, with no 404
fallback in its log; the OpenAI routes (official ``openai`` client), ``/generate`` and a DSL
program (``agentlang.RuntimeEndpoint`` pointed at the router) work through it, and requests
reach both replicas.
"""

from __future__ import annotations

import httpx
import pytest
from server_harness import metrics

from tests.support.cluster import router_workers, start_cluster   # importable: server_harness adds REPO

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def cluster():
    with start_cluster(2, "--kv-budget-mb", "48", policy="round_robin") as c:
        yield c


def test_router_discovers_the_model(cluster):
    workers = router_workers(cluster.url)
    assert sorted(w["url"] for w in workers) == sorted(r.url for r in cluster.replicas)
    for w in workers:
        assert w["is_healthy"] and w["model_id"] == MODEL, w
        meta = w["metadata"]
        assert meta["served_model_name"] == MODEL and meta["model_type"] == "llama"
        assert meta["model_path"].endswith("SmolLM2-135M-Instruct.Q4_1"), meta
    models = httpx.get(cluster.url + "/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == [MODEL]
    log = cluster.router.log()
    assert "falling back" not in log and "returned 404" not in log, log[-3000:]
    assert "No tokenizer_path or model_path" not in log


def test_openai_and_generate_through_the_router(cluster):
    from openai import OpenAI

    client = OpenAI(base_url=cluster.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4,
        temperature=0)
    assert chat.model == MODEL and chat.usage.completion_tokens == 4
    text = client.completions.create(model=MODEL, prompt="The capital of France is",
                                     max_tokens=3, temperature=0)
    assert text.choices[0].text.startswith(" Paris")
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to three."}], max_tokens=4,
        temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    before = [metrics(httpx.Client(base_url=r.url))["agentlang_requests_finished_total"]
              for r in cluster.replicas]
    with httpx.Client(base_url=cluster.url, timeout=120) as http:
        for _ in range(4):      # round robin: two land on each replica
            r = http.post("/generate", json={"text": "The capital of France is",
                                             "sampling_params": {"max_new_tokens": 3,
                                                                 "temperature": 0}})
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["text"].startswith(" Paris")
            assert out["meta_info"]["finish_reason"]["type"] == "length"
    after = [metrics(httpx.Client(base_url=r.url))["agentlang_requests_finished_total"]
             for r in cluster.replicas]
    assert all(a - b >= 2 for a, b in zip(after, before)), (before, after)


def test_dsl_program_through_the_router(cluster):
    import agentlang as al

    @al.function
    def qa(s, question):
        s += al.system("You answer in one word.")
        s += al.user(question)
        s += al.assistant(al.gen("answer", max_tokens=4, temperature=0))
        s += al.user("Is the sky blue?")
        s += al.assistant(al.select("yes_no", choices=["yes", "no"]))

    backend = al.RuntimeEndpoint(cluster.url)
    try:
        state = qa.run(question="What is the capital of France?", backend=backend)
    finally:
        backend.close()
    assert state["answer"] and state["yes_no"] in ("yes", "no")
