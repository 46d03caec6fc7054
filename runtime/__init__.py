"""agentlang runtime: paged KV pool, radix prefix cache, continuous batching engine."""

from runtime.engine import Engine, PrefixHandle
from runtime.outputs import CompletionOutput, RequestOutput, StreamDelta
from runtime.sampler import TokenLogprob
from runtime.sampling_params import SamplingParams

__all__ = ["Engine", "PrefixHandle", "SamplingParams", "RequestOutput", "CompletionOutput",
           "StreamDelta", "TokenLogprob"]
