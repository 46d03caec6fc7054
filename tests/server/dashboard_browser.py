"""Driving the dashboard in Debian's Chromium through Playwright, and the workloads it shows.
Shared by the browser tests and ``docs/make_dashboard_picture.py`` (the README screenshot).

Playwright's own browser download cannot work here: we launch ``/usr/bin/chromium``
(``apt-get install -y chromium``) with a fresh ``--user-data-dir``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

CHROMIUM = "/usr/bin/chromium"
INSTALL = "apt-get update && apt-get install -y chromium"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]
SHARED_PREFIX = ("You are the support assistant of a bicycle shop. Answer in one short sentence, "
                 "politely, and never invent prices. ")
QUESTIONS = ["Do you repair flat tyres?", "When do you open on Sunday?",
             "Can I rent a tandem?", "Do you sell helmets for children?"]


def chromium() -> str | None:
    """The Chromium executable, or None when it is not installed."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    return shutil.which("chromium")


@contextlib.contextmanager
def open_dashboard(url: str, user_data_dir: Path, api_key: str | None = None,
                   size: tuple[int, int] = (1360, 1300)) -> Iterator:
    """A Playwright page on ``url + "/dashboard"`` (after its first data poll when no key is
    needed; with ``api_key`` the key form is filled in first)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(user_data_dir), executable_path=chromium(), headless=True, args=LAUNCH_ARGS,
            viewport={"width": size[0], "height": size[1]})
        try:
            page = ctx.new_page()
            page.goto(url + "/dashboard")
            if api_key is not None:
                page.wait_for_selector("#keyform:not([hidden])", timeout=20_000)
                page.fill("#apikey", api_key)
                page.click("#keyform button")
            wait_js(page, "window.dashboard.state.polls >= 1", 30)
            yield page
        finally:
            ctx.close()


def wait_js(page, predicate: str, timeout_s: float) -> None:
    page.wait_for_function(predicate, timeout=timeout_s * 1000, polling=100)


def poll_now(page) -> dict:
    """Make the page fetch and draw once more now; returns the document it drew."""
    page.evaluate("window.dashboard.poll()")
    return page.evaluate("window.dashboard.state.data")


def page_figures(page) -> dict[str, float]:
    """The KV-pool figures the page shows: /metrics series name → value."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
        '#figures [data-series]')].map(e => [e.dataset.series, Number(e.dataset.value)]))""")


def shared_prefix_rows(page) -> list[dict]:
    """The "Shared prefixes" table: label, tokens, children."""
    return page.evaluate("""() => [...document.querySelectorAll('#prefixes tbody tr')].map(
        tr => ({label: tr.cells[0].textContent, tokens: Number(tr.cells[1].textContent),
                children: Number(tr.cells[2].textContent), node: tr.dataset.node}))""")


def request_rows(page) -> int:
    return page.evaluate("document.querySelectorAll('#requests tbody tr').length")


def shared_prefix_workload(url: str, max_tokens: int = 40) -> list[dict]:
    """Four concurrent ``/generate`` calls sharing one prompt prefix (greedy)."""
    def one(q: str) -> dict:
        r = httpx.post(url + "/generate", timeout=300, json={
            "text": SHARED_PREFIX + q,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0,
                                "ignore_eos": True}})
        r.raise_for_status()
        return r.json()

    with cf.ThreadPoolExecutor(len(QUESTIONS)) as ex:
        return list(ex.map(one, QUESTIONS))


def fork_program(view_tokens: int = 32):
    """A DSL program with one fork of three branches (``view_tokens`` each) and a join."""
    import agentlang as al

    @al.function
    def bike_plan(s, goal):
        s += f"Plan for: {goal}.\nFirst step:" + al.gen("first", max_tokens=6)
        forks = s.fork(3)
        for f, angle in zip(forks, ["cost", "safety", "time"]):
            f += f"\nThe {angle} view:" + al.gen("view", max_tokens=view_tokens, ignore_eos=True)
        forks.join()
        s += "\nDecision:" + al.gen("decision", max_tokens=6)

    return bike_plan


def run_fork_program(url: str, view_tokens: int = 32):
    """Runs :func:`fork_program` on the server at ``url``; returns its state."""
    import agentlang as al

    backend = al.RuntimeEndpoint(url)
    try:
        return fork_program(view_tokens).run(goal="a city bike tour", temperature=0, backend=backend)
    finally:
        backend.close()


def in_background(*jobs: Callable[[], object]) -> list[cf.Future]:
    ex = cf.ThreadPoolExecutor(len(jobs))
    futures = [ex.submit(j) for j in jobs]
    ex.shutdown(wait=False)
    return futures


def synthetic_cache(min_nodes: int, seed: int = 0):
    """A real :class:`RadixCache` (page_size 1) holding at least ``min_nodes`` nodes, from
    random branching keys."""
    from agentlang.runtime.cache.snapshot import snapshot_tree
    from agentlang.runtime.cache.page_allocator import PageAllocator
    from agentlang.runtime.cache.radix_cache import RadixCache

    rnd = random.Random(seed)
    cache = RadixCache(PageAllocator(20 * min_nodes), page_size=1)
    while len(snapshot_tree(cache, 10 * min_nodes).rows) < min_nodes:
        for _ in range(500):
            key = [rnd.randrange(6) for _ in range(rnd.randrange(4, 14))]
            cache.release_into_cache(key, cache.allocator.allocate(len(key)))
    return cache


def synthetic_tree(min_nodes: int, seed: int = 0) -> dict:
    """The tree document of :func:`synthetic_cache`, as ``/dashboard/data`` sends it."""
    from agentlang.runtime.cache.snapshot import snapshot_tree
    from agentlang.runtime.server.ops.dashboard_data import tree_json

    snap = snapshot_tree(synthetic_cache(min_nodes, seed), 10 * min_nodes)
    return tree_json(snap, lambda ids: " ".join(map(str, ids)))


def render_tree_ms(page, tree: dict) -> dict:
    """Stop polling and render ``tree`` in the page; the browser's own timing (ms) of the whole
    call (layout + drawing + the shared-prefix table)."""
    return page.evaluate("""(tree) => { window.dashboard.stop();
        const t0 = performance.now(); const r = window.dashboard.renderTree(tree, 1);
        return {...r, total_ms: performance.now() - t0}; }""", tree)


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.1)
