"""Where a stream sits in its program run's fork tree, and the tag a generation carries.

The tag (``Prompt.tag``) travels to our server as an optional top-level ``program`` field of
``/generate`` (SGLang's server ignores unknown top-level keys), so live views can draw a run's
fork/join graph and highlight the branch that is decoding.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BranchId:
    """``path`` is ``"0"`` for the root and ``"<parent>/<fork>.<i>"`` for child ``i`` of the
    parent's ``fork``-th fork; ``after`` is how many generations the parent had started when it
    forked."""

    path: str = "0"
    parent: str | None = None
    after: int = 0

    def tag(self, run_id: str, name: str) -> dict:
        """The run / branch tag of this branch's next generation (see ``Prompt.tag``)."""
        tag = {"id": run_id, "name": name, "branch": self.path}
        if self.parent is not None:
            tag |= {"parent": self.parent, "after": self.after}
        return tag
