"""Engine settings, validated at engine start."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentlang.runtime.cache.kv_quant import check_kv_dtype_support
from agentlang.runtime.speculative.policy import (DEFAULT_MAX_DRAFT, ROW_COST, check_max_draft,
                                                  check_row_cost)
from agentlang.runtime.speculative.shared_lookup import SHARED_CAP
from agentlang.runtime.core.program_service import check_schedule_policy
from agentlang.runtime.quant.native.cpu_features import (BF16_FLAGS, INT8_DOT_FLAGS,
                                                         bf16_matmuls_in_hardware,
                                                         int8_matmuls_in_hardware)
from agentlang.runtime.scheduler.live_programs import busy_requests
from agentlang.runtime.scheduler.config import SchedulerConfig
from agentlang.runtime.weights.model_loader import WEIGHTS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    model: str = "default"
    dtype: str = "float32"
    # "dense": decoded to dtype (exact, cache/batch-invariant greedy outputs) | "auto": a GGUF's
    # Q4_0/Q4_1/Q8_0 stay quantized (bf16 int4/int8 matmuls: faster at batch 1, but prefill-sized
    # and GEMV-sized calls round differently, so near-ties can flip with cache state) | "int8":
    # the dense weights quantized per output channel and activations per token, int8 GEMMs
    # (CPU; ~1.3-1.8x bf16's linears, bitwise batch-invariant, less precise: quant/int8_linear)
    weights: str = "dense"
    # weights "auto": a GGUF's native weights' calls of this many rows or more (prefill chunks)
    # run as bf16 GEMMs on CPUs with bf16 instructions. None: the dtype's default (from 32 rows
    # in a bfloat16 model, never in a float32 one: its rows stay bitwise invariant)
    bf16_gemm_rows: int | None = None
    device: str = "cpu"
    page_size: int = 16
    kv_budget_mb: float | None = None     # default: 512 MB on CPU, 40% of free memory on GPU
    num_pages: int | None = None          # overrides kv_budget_mb
    window_kv_fraction: float | None = None   # sliding layers' pages per global page (cache/window_pages)
    kv_dtype: str = "auto"                # "auto" (model dtype) | "bfloat16" | "int8" | "fp8_e4m3" | "fp8_e5m2"
    max_batch_tokens: int = 2048
    max_running: int = 64
    max_wait_steps: int = 64              # aging: +1 effective priority per this many steps waited
    schedule_low_priority_values_first: bool = False   # priority direction (agentlang.runtime.core.priority)
    schedule_policy: str = "lpm"          # "program" / "continue" / "live": least / most served
                                          # first (core.program_service)
    max_lower_priority_tokens: int = 8    # lower-priority tokens in an urgent step (priority.py)
    urgent_slots: int = 4                 # above max_running: requests outranking a running one
    max_agent_labels: int = 32            # per-agent accounting series before "other"
    attention_backend: str = "auto"
    grammar_backend: str = "xgrammar"
    enable_prefix_cache: bool = True
    seed: int = 0
    cuda_graph: bool | None = None        # decode from CUDA graphs; None: on for CUDA + triton
    # model-free speculative decoding (agentlang.runtime.speculative): the default of requests
    # that do not set ``speculative``; draft cap; a verify row's cost relative to a step;
    # entries of the index of other requests' outputs (0: drafts from the own context only)
    speculative: bool = False
    speculative_max_draft: int = DEFAULT_MAX_DRAFT
    speculative_row_cost: float | None = None   # None: measured (speculative/calibrate.py)
    speculative_shared_cap: int = SHARED_CAP
    # sessions (agentlang.runtime.engine.sessions): open at most; a finished turn's KV held at
    # most this long; session holds keep at most this share of the pool; idle timeout default
    max_sessions: int = 1024
    session_hold_s: float = 30.0
    session_max_fraction: float = 0.8
    session_timeout_s: float | None = 600.0

    def validate(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {list(WEIGHTS)}, got {self.weights!r}")
        if self.weights == "int8" and self.device != "cpu":
            raise ValueError(f"weights='int8' runs on the CPU only, got device {self.device!r}")
        if self.weights == "int8" and not int8_matmuls_in_hardware():
            raise ValueError(
                f"weights='int8' needs a CPU with int8 dot products ({', '.join(INT8_DOT_FLAGS)});"
                " this one has none, and its int8 GEMM would run ~15x slower than float32: use"
                " weights 'auto' or 'dense'")
        self._check_bf16_gemm_rows()
        if self.page_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ValueError(f"page_size must be a power of two in [1, 128], got {self.page_size!r}")
        for name in ("max_batch_tokens", "max_running", "max_wait_steps",
                     "max_lower_priority_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.schedule_low_priority_values_first, bool):
            raise ValueError(f"schedule_low_priority_values_first must be a boolean, got "
                             f"{self.schedule_low_priority_values_first!r}")
        if not isinstance(self.urgent_slots, int) or isinstance(self.urgent_slots, bool) or \
                self.urgent_slots < 0:
            raise ValueError(f"urgent_slots must be an integer >= 0, got {self.urgent_slots!r}")
        if not isinstance(self.max_agent_labels, int) or self.max_agent_labels < 0:
            raise ValueError(f"max_agent_labels must be an integer >= 0, got "
                             f"{self.max_agent_labels!r}")
        if self.kv_budget_mb is not None and not self.kv_budget_mb > 0:
            raise ValueError(f"kv_budget_mb must be > 0, got {self.kv_budget_mb!r}")
        if self.window_kv_fraction is not None and not 0 < self.window_kv_fraction <= 1:
            raise ValueError(f"window_kv_fraction must be in (0, 1], got {self.window_kv_fraction!r}")
        if self.num_pages is not None and (not isinstance(self.num_pages, int) or self.num_pages < 2):
            raise ValueError(f"num_pages must be an integer >= 2, got {self.num_pages!r}")
        if self.cuda_graph is not None and not isinstance(self.cuda_graph, bool):
            raise ValueError(f"cuda_graph must be True, False or None (auto), got {self.cuda_graph!r}")
        if not isinstance(self.speculative, bool):
            raise ValueError(f"speculative must be True or False, got {self.speculative!r}")
        check_max_draft(self.speculative_max_draft, "speculative_max_draft")
        if self.speculative_row_cost is not None:
            check_row_cost(self.speculative_row_cost, "speculative_row_cost")
        check_schedule_policy(self.schedule_policy)
        cap = self.speculative_shared_cap
        if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap <= 2 ** 24:
            raise ValueError(f"speculative_shared_cap must be an integer in [0, {2 ** 24}] "
                             f"(0: no shared index), got {cap!r}")
        if not isinstance(self.max_sessions, int) or isinstance(self.max_sessions, bool) or \
                self.max_sessions < 0:
            raise ValueError(f"max_sessions must be an integer >= 0, got {self.max_sessions!r}")
        for name, lo, hi in (("session_hold_s", 0.0, 86400.0), ("session_max_fraction", 0.0, 1.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"{name} must be a number in [{lo:g}, {hi:g}], got {v!r}")
        if self.session_timeout_s is not None and (
                isinstance(self.session_timeout_s, bool)
                or not isinstance(self.session_timeout_s, (int, float))
                or not 0 < self.session_timeout_s <= 86400):
            raise ValueError(f"session_timeout_s must be a number in (0, 86400] or None, got "
                             f"{self.session_timeout_s!r}")
        if self.grammar_backend not in ("xgrammar", "outlines"):
            raise ValueError(
                f"grammar_backend must be 'xgrammar' or 'outlines', got {self.grammar_backend!r}"
            )
        try:
            device = torch.device(self.device)
        except RuntimeError as e:
            raise ValueError(f"device: {e}") from None
        check_kv_dtype_support(self.kv_dtype, device, self.attention_backend)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def scheduler_config(self, num_pages: int) -> SchedulerConfig:
        """The scheduler's settings for a pool of ``num_pages`` pages."""
        return SchedulerConfig(self.page_size, self.max_batch_tokens, self.max_running,
                               self.max_wait_steps, schedule_policy=self.schedule_policy,
                               low_priority_values_first=self.schedule_low_priority_values_first,
                               max_lower_priority_tokens=self.max_lower_priority_tokens,
                               urgent_slots=self.urgent_slots,
                               retain_max_pages=int(self.session_max_fraction * num_pages),
                               busy_requests=busy_requests(
                                   ROW_COST if self.speculative_row_cost is None
                                   else self.speculative_row_cost))

    def _check_bf16_gemm_rows(self) -> None:
        rows = self.bf16_gemm_rows
        if rows is None:
            return
        if not isinstance(rows, int) or isinstance(rows, bool) or not 1 <= rows <= 1 << 20:
            raise ValueError(f"bf16_gemm_rows must be an integer in [1, {1 << 20}] or None "
                             f"(the dtype's default), got {rows!r}")
        if self.weights != "auto" or self.device != "cpu":
            raise ValueError("bf16_gemm_rows applies to a GGUF's quantized weights on the CPU "
                             f"(weights 'auto', device 'cpu'), got weights {self.weights!r}, "
                             f"device {self.device!r}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"bf16_gemm_rows applies to dtype 'float32' or 'bfloat16', got "
                             f"{self.dtype!r}")
        if not bf16_matmuls_in_hardware():
            raise ValueError(f"bf16_gemm_rows needs a CPU with bf16 instructions "
                             f"({', '.join(BF16_FLAGS)}); this one has none and would emulate "
                             "the GEMMs: leave it unset")
