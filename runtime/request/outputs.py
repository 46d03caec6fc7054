"""What the engine returns: completed outputs and streaming deltas."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentlang.runtime.core.errors import EngineError
from agentlang.runtime.sampling.sampler import TokenLogprob


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None             # "stop" | "length" | "abort" | None (running)
    matched_stop: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    # tokens the budget guard substituted so the output completes within max_tokens
    # (agentlang.runtime.grammar.budget); 0 when the model's own tokens fit
    forced_completion_tokens: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    meta: dict = field(default_factory=dict)
    # prompt_logprobs[i] is the logprob of prompt token i (None where not computed)
    prompt_logprobs: list[float | None] | None = None
    error: EngineError | None = None

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


@dataclass
class StreamDelta:
    """Incremental output of one completion (``index``) of a request."""

    request_id: str
    index: int
    text: str                 # new text since the previous delta of this completion
    token_ids: list[int]      # new token ids since the previous delta
    finished: bool            # this completion is done
    output: RequestOutput | None = None   # set on the request's very last delta
    logprobs: list[TokenLogprob] | None = None
