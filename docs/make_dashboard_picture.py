"""Makes docs/img/dashboard.png, the README's screenshot of the live dashboard, with the code of
the browser tests (tests/server/dashboard_browser.py): it starts the server on a free port,
opens /dashboard in Debian's Chromium, runs the shared-prefix workload and the fork program,
and captures the page while a fork branch decodes.

    apt-get install -y chromium     # once
    python docs/make_dashboard_picture.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "server"))
from dashboard_browser import (INSTALL, chromium, in_background, open_dashboard,  # noqa: E402
                               run_fork_program, shared_prefix_workload, wait_js)
from server_harness import start_server  # noqa: E402


def main() -> None:
    if chromium() is None:
        sys.exit(f"needs Chromium: {INSTALL}")
    out = ROOT / "docs" / "img" / "dashboard.png"
    server = start_server()
    try:
        with tempfile.TemporaryDirectory() as profile, \
                open_dashboard(server.url, Path(profile), size=(1360, 1120)) as page:
            shared_prefix_workload(server.url, max_tokens=24)      # a warm tree first
            jobs = in_background(lambda: shared_prefix_workload(server.url),
                                 lambda: run_fork_program(server.url))
            wait_js(page, "document.querySelector('#programs circle.decoding"
                          "[data-branch^=\"0/0.\"]') !== null", 120)
            wait_js(page, "window.dashboard.state.data.requests.length >= 3", 30)
            page.screenshot(path=str(out), full_page=True)
            for j in jobs:
                j.result(timeout=300)
    finally:
        server.stop()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
