"""Model-free speculative decoding: drafts from the request's own context
(:mod:`~agentlang.runtime.speculative.context_lookup`) and from recent outputs of other
requests of its namespace (:mod:`~agentlang.runtime.speculative.shared_lookup`), a draft length chosen from the
acceptance seen so far and the cost of a verify row (:mod:`~agentlang.runtime.speculative.policy`),
measured on the machine unless given (:mod:`~agentlang.runtime.speculative.calibrate`).
Verification is jump-forward's (:mod:`agentlang.runtime.engine.constrained_step`): one extend
step over the draft, each row sampled with the request's own generator, accepted while the
sample equals the draft, so outputs are the same with speculation on or off."""

from agentlang.runtime.speculative.context_lookup import ContextLookup
from agentlang.runtime.speculative.policy import DraftPolicy, DraftStats
from agentlang.runtime.speculative.shared_lookup import SHARED_CAP, SharedLookup

__all__ = ["ContextLookup", "DraftPolicy", "DraftStats", "SHARED_CAP", "SharedLookup"]
