"""The dashboard in a real browser (Playwright driving Debian's Chromium) against the real server:
a shared-prefix workload and a fork program run while the page is open, and the tests assert on
what the page shows. Screenshots go to pytest's temporary folder. Without Chromium these tests
skip and name the install command; with ``CI=true`` they fail instead."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
from dashboard_browser import (INSTALL, SHARED_PREFIX, chromium, in_background, open_dashboard,
                               page_figures, poll_now, render_tree_ms, request_rows,
                               run_fork_program, shared_prefix_rows, shared_prefix_workload,
                               synthetic_tree, wait_js)
from server_harness import API_KEY, metrics, start_server, wait_idle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def browser_available():
    missing = None
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing = "the playwright package (pip install -c constraints.txt '.[browser]')"
    if chromium() is None:
        missing = f"Chromium ({INSTALL})"
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {missing} is missing")
        pytest.skip(f"browser tests need {missing}")


def test_page_follows_prefix_workload_and_fork_program(server, http, tmp_path):
    shots = tmp_path / "shots"
    shots.mkdir()
    with open_dashboard(server.url, tmp_path / "profile") as page:
        jobs = in_background(lambda: shared_prefix_workload(server.url),
                             lambda: run_fork_program(server.url, view_tokens=192))
        # while they run: the request table fills and a branch of the program decodes (the
        # page polls once a second, so the branches decode for several seconds however fast
        # the engine is: with 32 tokens a fast engine finished them between two polls)
        wait_js(page, "document.querySelectorAll('#requests tbody tr').length > 0", 60)
        # a fork branch (not the root) shows as decoding, in the graph and its caption
        wait_js(page, "document.querySelector('#programs circle.decoding[data-branch^=\"0/0.\"]')"
                " !== null", 120)
        page.screenshot(path=str(shots / "running.png"), full_page=True)
        assert "decoding: 0/0." in page.inner_text("#programs")
        answers = jobs[0].result(timeout=300)
        state = jobs[1].result(timeout=300)
        assert len(answers) == 4 and len(state["view"]) > 0
        # done: the table empties
        wait_idle(http)
        wait_js(page, "document.querySelectorAll('#requests tbody tr').length === 0", 30)
        assert page.is_visible("#no-requests")
        data = poll_now(page)
        page.screenshot(path=str(shots / "idle.png"), full_page=True)

        # the shared prefix with its four children in the tree
        rows = shared_prefix_rows(page)
        hit = [r for r in rows if r["label"].startswith(SHARED_PREFIX[:40]) and r["children"] >= 4]
        assert hit, rows
        node = int(hit[0]["node"])
        layout = {n["id"]: n for n in page.evaluate("window.dashboard.state.layout")}
        tree = {r[0]: r for r in data["tree"]["nodes"]}
        kids = [layout[i] for i, r in tree.items() if r[1] == node and i in layout]
        assert len(kids) >= 4
        parent = layout[node]
        for k in kids:      # drawn one row below, inside the parent's span
            assert k["y"] > parent["y"] and parent["x"] - 1e-6 <= k["x"] <= parent["x"] + parent["w"]

        # the program's fork/join graph: 1 + 3 + 1 generations; root → 3 branches → root
        graph = page.evaluate("""() => { const p = window.dashboard.state.data.programs
            .find(p => p.name === 'bike_plan'); return p; }""")
        assert graph is not None
        assert len(graph["nodes"]) == 5 and not graph["active"]
        kinds = sorted(e[2] for e in graph["edges"])
        assert kinds == ["fork"] * 3 + ["join"] * 3 + ["seq"]
        assert page.locator("#programs .program[data-program] circle").count() >= 5

        # page-map counts equal /metrics (the engine is idle: nothing changes in between)
        m = metrics(http)
        shown = page_figures(page)
        assert len(shown) >= 12
        for series, value in shown.items():
            assert value == pytest.approx(m[series], abs=1e-9), series
        codes = data["pool"]["map"]
        assert [codes.count(c) for c in "0123"] == [
            m["agentlang_kv_pages_free"], m["agentlang_kv_pages_cache_only"],
            m["agentlang_kv_pages_private"], m["agentlang_kv_pages_shared"]]

        # a session that ended a turn shows what it holds for its next one; closed, it is gone
        r = httpx.post(server.url + "/generate", timeout=120, json={
            "text": SHARED_PREFIX, "session_id": "dash-agent",
            "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
        assert r.status_code == 200, r.text
        wait_js(page, "document.querySelector('#sessions tr.held[data-session=\"dash-agent\"]')"
                " !== null", 30)
        held = page.inner_text('#sessions tr[data-session="dash-agent"]').split("\t")
        assert int(held[2]) == metrics(http)[
            "agentlang_session_held_pages_by_session[('session', 'dash-agent')]"] > 0
        page.screenshot(path=str(shots / "session.png"), full_page=True)
        httpx.post(server.url + "/close_session", json={"session_id": "dash-agent"})
        wait_js(page, "document.querySelector('#sessions tr[data-session=\"dash-agent\"]')"
                " === null", 30)
    assert (shots / "running.png").stat().st_size > 10_000


def test_ten_thousand_node_tree_renders_within_a_second(server, tmp_path):
    tree = synthetic_tree(10_000)
    assert len(tree["nodes"]) >= 10_000
    with open_dashboard(server.url, tmp_path / "profile") as page:
        r = render_tree_ms(page, tree)
        page.screenshot(path=str(tmp_path / "tree10k.png"), full_page=True)
    assert r["nodes"] == len(tree["nodes"])
    assert r["drawn"] + r["collapsed"] <= r["nodes"] and r["drawn"] > 100
    assert r["total_ms"] <= 1000, r


@pytest.fixture(scope="module")
def auth_server():
    srv = start_server("--api-key", API_KEY, "--kv-budget-mb", "8")
    yield srv
    srv.stop(signal.SIGKILL)


def test_with_api_key_the_page_asks_once_and_sends_bearer(auth_server, tmp_path):
    html = httpx.get(auth_server.url + "/dashboard").text           # open, and carries no data
    assert "SmolLM" not in html and "agentlang_kv" not in html
    assert httpx.get(auth_server.url + "/dashboard/data").status_code == 401
    headers = {"Authorization": f"Bearer {API_KEY}"}
    assert httpx.get(auth_server.url + "/dashboard/data", headers=headers).status_code == 200
    with open_dashboard(auth_server.url, tmp_path / "profile", api_key=API_KEY) as page:
        assert page_figures(page)["agentlang_kv_pages_total"] > 0
        page.reload()                                                # asked once per tab
        wait_js(page, "window.dashboard.state.polls >= 1", 30)
        assert page.is_hidden("#keyform")
        assert request_rows(page) == 0
