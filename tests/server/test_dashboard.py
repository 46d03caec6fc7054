"""``/dashboard`` and ``/dashboard/data`` over HTTP against the real server (no browser): bad input
gets a 400 naming the field, the document's figures equal ``/metrics``, program tags sent by
``RuntimeEndpoint`` build the run's graph, and nothing leaks KV pages."""

from __future__ import annotations

import httpx
import pytest
from dashboard_browser import run_fork_program
from server_harness import metrics, pages_after_flush, wait_idle

pytestmark = pytest.mark.slow


def test_page_and_static_files(http):
    r = http.get("/dashboard")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/dashboard/static/dashboard.js" in r.text
    assert http.get("/dashboard/static/dashboard.js").headers["content-type"].startswith(
        "text/javascript")
    r = http.get("/dashboard/static/secrets.txt")
    assert r.status_code == 404 and r.json()["error"]["param"] == "name"


@pytest.mark.parametrize("value", ["abc", "-1", "20001", "1.5", "", "1e3", " 5"])
def test_bad_max_nodes_is_400_naming_it(http, value):
    r = http.get("/dashboard/data", params={"max_nodes": value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "max_nodes" and "[0, 20000]" in err["message"]


@pytest.mark.parametrize("program,field", [
    ("run-1", "program"), ({"branch": "0"}, "program.id"),
    ({"id": "r", "branch": 7}, "program.branch"), ({"id": "r", "branch": "0", "after": "1"},
                                                   "program.after")])
def test_bad_program_tag_is_400_naming_the_field(http, program, field):
    r = http.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 1},
                                     "program": program})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_document_equals_metrics_and_is_bounded(http):
    wait_idle(http)
    d = http.get("/dashboard/data", params={"max_nodes": 3}).json()
    m = metrics(http)
    for name, value in d["pool"]["figures"].items():
        assert value == pytest.approx(m[d["pool"]["series"][name]], abs=1e-9), name
    codes = d["pool"]["map"]
    assert len(codes) == m["agentlang_kv_pages_total"]
    assert codes.count("0") == m["agentlang_kv_pages_free"]
    assert len(d["tree"]["nodes"]) <= 3 and d["cost_ms"] >= 0
    assert d["requests"] == []
    assert http.get("/dashboard/data", params={"max_nodes": 0}).json()["tree"] is None
    assert set(d["series"]) == {"t", "tokens_per_s", "hit_rate", "queue", "kv_use", "running"}


def test_runtime_endpoint_tags_build_the_fork_join_graph(server, http):
    before = pages_after_flush(http)
    state = run_fork_program(server.url)
    assert len(state["view"]) > 0
    wait_idle(http)
    progs = http.get("/dashboard/data").json()["programs"]
    g = next(p for p in progs if p["name"] == "bike_plan")
    assert [(n["branch"], n["step"]) for n in g["nodes"]][0] == ("0", 0)
    assert sorted(n["branch"] for n in g["nodes"]) == ["0", "0", "0/0.0", "0/0.1", "0/0.2"]
    assert all(n["state"] == "done" for n in g["nodes"]) and g["active"] == []
    assert pages_after_flush(http) == before


def test_plain_sglang_style_body_needs_no_tag(server):
    r = httpx.post(server.url + "/generate", timeout=120,
                   json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] >= 1
