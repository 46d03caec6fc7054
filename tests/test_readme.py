"""README.md cannot rot: every ```python block in it is executed by this test.

Rules for README authors:

- Blocks run in order, in one namespace (a later block may use names an earlier one defined),
  in a temporary working directory (files a block writes do not litter the repository).
- A block is skipped only when its first line is exactly ``# readme: skip``; use sparingly.
- A block that talks to a server reads its URL the way a user would point it elsewhere:
  ``os.environ.get("AGENTLANG_URL", "http://127.0.0.1:30000")``. When any block mentions
  ``AGENTLANG_URL`` the test starts a real server subprocess and sets the variable to it.
- Backends a block leaves open are closed afterwards and the default backend is reset.
Tracebacks point at README.md's own line numbers.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SKIP_MARKER = "# readme: skip"
SERVER_VARIABLE = "AGENTLANG_URL"
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


class Block(NamedTuple):
    line: int   # README line of the block's first code line (1-based)
    code: str

    @property
    def skipped(self) -> bool:
        first = self.code.splitlines()[0].strip() if self.code.strip() else ""
        return first == SKIP_MARKER


def python_blocks(markdown: str) -> list[Block]:
    """The ```python fenced blocks of a Markdown text, in order."""
    return [Block(markdown.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in _FENCE.finditer(markdown)]


def run_blocks(blocks: list[Block], filename: str, namespace: dict) -> None:
    """Execute the non-skipped blocks in ``namespace``; line numbers match ``filename``."""
    for block in blocks:
        if block.skipped:
            continue
        exec(compile("\n" * (block.line - 1) + block.code, filename, "exec"), namespace)


# -- the extractor itself -----------------------------------------------------------------
SAMPLE = """# Title
```bash
make run
```
```python
x = 1
```
Text.
```python
# readme: skip
raise SystemExit("never runs")
```
```python
y = x + 1  # readme: skip only counts on the first line
```
"""


def test_python_blocks_are_extracted_in_order_with_line_numbers():
    blocks = python_blocks(SAMPLE)
    assert [b.code for b in blocks] == [
        "x = 1\n", '# readme: skip\nraise SystemExit("never runs")\n',
        "y = x + 1  # readme: skip only counts on the first line\n"]
    assert [b.line for b in blocks] == [6, 10, 14]
    assert [b.skipped for b in blocks] == [False, True, False]
    namespace: dict = {}
    run_blocks(blocks, "SAMPLE.md", namespace)
    assert namespace["y"] == 2


def test_errors_point_at_the_readme_line():
    blocks = python_blocks("intro\n\n```python\na = 1\nb = undefined_name\n```\n")
    with pytest.raises(NameError) as info:
        run_blocks(blocks, "DOC.md", {})
    tb = info.tb
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert (tb.tb_frame.f_code.co_filename, tb.tb_lineno) == ("DOC.md", 5)


# -- the README -----------------------------------------------------------------------------
def test_readme_has_python_code():
    blocks = python_blocks(README.read_text())
    assert [b for b in blocks if not b.skipped], (
        f"{README} has no runnable ```python code blocks; the README must show working code "
        f"(it is executed by tests/test_readme.py)")


@pytest.mark.slow
def test_readme_python_blocks_run(monkeypatch, tmp_path):
    import agentlang as al

    blocks = python_blocks(README.read_text())
    runnable = [b for b in blocks if not b.skipped]
    if not runnable:
        pytest.fail(f"{README} has no runnable ```python code blocks")
    server = None
    if any(SERVER_VARIABLE in b.code for b in runnable):
        sys.path.insert(0, str(Path(__file__).parent / "server"))
        from server_harness import start_server

        server = start_server()
        monkeypatch.setenv(SERVER_VARIABLE, server.url)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    try:
        run_blocks(blocks, str(README), namespace)
    finally:
        for value in list(namespace.values()):
            if isinstance(value, al.Backend):
                value.close()
        al.set_default_backend(None)
        if server is not None:
            server.stop()
