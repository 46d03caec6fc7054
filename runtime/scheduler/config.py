"""The scheduler's settings (one frozen record; ``EngineConfig.scheduler_config`` builds it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    page_size: int = 16
    max_batch_tokens: int = 2048
    max_running: int = 64
    max_wait_steps: int = 64
    min_shared_prefix: int = 32   # tokens of in-flight overlap that make a request wait a step
    low_priority_values_first: bool = False
    max_lower_priority_tokens: int = 8   # lower-priority tokens in an urgent step
    urgent_slots: int = 4   # running above max_running for requests that outrank a running one
    retain_max_pages: int = 0   # pages session holds may keep (cache.retention)
    schedule_policy: str = "lpm"   # or "program" / "continue" / "live" (core.program_service)
    busy_requests: int | None = None   # ``live``: running requests before a new program starts
