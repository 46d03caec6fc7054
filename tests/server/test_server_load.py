"""Bounded load: 32 concurrent streaming clients x 2 requests each (small max_tokens) on a small
KV pool; zero errors, every stream complete, the pool back at its baseline."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from server_harness import metrics, pages_after_flush

pytestmark = pytest.mark.slow

CLIENTS = 32
REQUESTS_PER_CLIENT = 2
MAX_TOKENS = 4


async def _one_client(url: str, cid: int) -> list[dict]:
    results = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        for k in range(REQUESTS_PER_CLIENT):
            body = {"model": "default", "stream": True, "max_tokens": MAX_TOKENS,
                    "temperature": 0, "ignore_eos": True,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user",
                                  "content": f"Client {cid}, request {k}: name a number."}]}
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = [ln async for ln in r.aiter_lines() if ln.startswith("data:")]
            events = [json.loads(ln[5:]) for ln in lines if ln != "data: [DONE]"]
            results.append({"status": r.status_code, "done": lines[-1:] == ["data: [DONE]"],
                            "errors": [e for e in events if "error" in e],
                            "usage": events[-1].get("usage") if events else None,
                            "finish": [ch["finish_reason"] for e in events
                                       for ch in e.get("choices", []) if ch["finish_reason"]]})
    return results


def test_32_concurrent_streaming_clients(server, http):
    baseline = pages_after_flush(http)
    before = metrics(http)

    async def run() -> list[list[dict]]:
        return await asyncio.gather(*[_one_client(server.url, i) for i in range(CLIENTS)])

    results = [r for per_client in asyncio.run(run()) for r in per_client]
    assert len(results) == CLIENTS * REQUESTS_PER_CLIENT
    assert all(r["status"] == 200 and r["done"] and not r["errors"] for r in results), \
        [r for r in results if r["status"] != 200 or r["errors"]][:3]
    assert all(r["finish"] == ["length"] for r in results)
    assert all(r["usage"]["completion_tokens"] == MAX_TOKENS for r in results)
    after = metrics(http)
    assert after["agentlang_generation_tokens_total"] - \
        before["agentlang_generation_tokens_total"] == len(results) * MAX_TOKENS
    assert after["agentlang_kv_pages_peak"] > 0
    assert pages_after_flush(http) == baseline
    assert http.get("/health").status_code == 200
