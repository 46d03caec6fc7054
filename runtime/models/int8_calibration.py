"""What ``weights="int8"`` measures before it quantizes: each linear's input range per channel,
and the quantization of a loaded model with them (:func:`quantize_model`).

A few input channels of a transformer's activations are far larger than the rest (after the
norms, and after SwiGLU), and one int8 step per token must span them, so the rest lose their
precision. SmoothQuant (Xiao et al., 2023) moves part of that range into the weights: with
``a_k`` the largest ``|x_k|`` seen on input channel k and ``w_k`` the largest ``|W[:, k]|``,

    s_k = a_k ** ALPHA / w_k ** (1 - ALPHA);   x W^T = (x / s) (W s)^T

the weight's columns are scaled by ``s`` before they are quantized, and each activation row is
divided by ``s`` (a multiply in the quantize pass) before it is
(:func:`agentlang.runtime.quant.int8_linear.smoothing`). ``a`` comes from one forward of
:data:`CALIBRATION_TEXT` (chat, prose, code, JSON, numbers; every position's logits, so the LM
head sees every row too) through the dense model at load (about 0.3 s for the embedded model). Measured on the embedded model (``bench/cpu_local.py --models int8``): mean KL to the
float32 model 0.037 without smoothing, 0.012 with ALPHA 0.5 (0.017 at 0.4, 0.019 at 0.7).
"""

from __future__ import annotations

import torch
from torch import nn

from agentlang.runtime.attention.base import make_backend
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.cache.page_allocator import PageAllocator
from agentlang.runtime.quant.int8_linear import int8_linears

PAGE = 16

CALIBRATION_TEXT = """\
<|im_start|>system
You are a careful assistant. Answer briefly and say when you are unsure.<|im_end|>
<|im_start|>user
Our team ships a small web service. Requests arrive at about forty per second during the day
and drop to three at night. Which metrics should we watch first, and why?<|im_end|>
<|im_start|>assistant
Start with latency percentiles (p50, p95, p99), the error rate per endpoint, and saturation:
CPU, memory and the length of any queue. Latency tells you what users feel; errors tell you what
breaks; saturation warns you before either moves.<|im_end|>
The river rose slowly through the night. By morning the lower fields were under water, and the
farmers moved their animals to the ridge where the old chapel stood. Nobody spoke much.
def merge(intervals):
    intervals.sort(key=lambda iv: iv[0])
    out = []
    for start, end in intervals:
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out
{"name": "Ada Lovelace", "born": 1815, "fields": ["mathematics", "computing"], "active": true}
Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. In 2024 the mean
price was 3.75 EUR per kilogram; by 2026 it had risen 12 percent, to 4.20 EUR.
Q: What is 17 times 23? A: 391. Q: Name three prime numbers above 50. A: 53, 59 and 61.
"""


def input_ranges(model: nn.Module, token_ids: list[int]) -> dict[nn.Linear, torch.Tensor]:
    """The largest ``|x|`` per input channel (float32 ``[in]``) that each ``nn.Linear`` of
    ``model`` (a :class:`~agentlang.runtime.models.llama.LlamaModel` on the CPU) sees while
    the model runs ``token_ids`` as one prefill."""
    cfg = model.config
    dtype = next(model.parameters()).dtype
    pages = -(-len(token_ids) // PAGE)
    pool = KVPool(KVLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype,
                           layer_windows=cfg.layer_windows), PAGE, num_pages=pages + 1)
    table = PageAllocator(pages + 1).allocate(pages)
    batch = build_forward_batch([token_ids], [0], [table], PAGE,
                                logits_rows=[list(range(len(token_ids)))])   # the LM head too
    seen: dict[nn.Linear, torch.Tensor] = {}

    def record(mod: nn.Module, args: tuple) -> None:
        a = args[0].reshape(-1, args[0].shape[-1]).abs().amax(0).float()
        seen[mod] = torch.maximum(seen[mod], a) if mod in seen else a

    hooks = [m.register_forward_pre_hook(record) for m in model.modules() if type(m) is nn.Linear]
    try:
        with torch.inference_mode():
            model(batch, pool, make_backend("torch", torch.device("cpu")))
    finally:
        for h in hooks:
            h.remove()
    return seen


def quantize_model(model: nn.Module, tokenizer) -> int:
    """``weights="int8"`` on a loaded dense ``model``: its linears' input ranges measured on
    :data:`CALIBRATION_TEXT` (tokenized by ``tokenizer``), then every linear replaced by a
    smoothed :class:`~agentlang.runtime.quant.int8_linear.Int8Linear`; returns how many."""
    ids = tokenizer(CALIBRATION_TEXT, add_special_tokens=False)["input_ids"]
    return int8_linears(model, input_ranges(model, ids))
