"""The engine: its public API and the step (schedule -> run -> process outputs), the thread
that steps it, building requests, tracking them, output processing and constrained sampling,
metrics and snapshots. The in-process API is :class:`.engine.Engine`; every layer below is
imported from here, nothing below imports it."""
