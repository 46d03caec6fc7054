"""Continuous batching: which requests run this step, with which pages, and preemption
(:mod:`.scheduler`); one step's items (:mod:`.scheduled`). Imports request, cache and core."""
