"""The bf16 layer's element-wise kernels (``glue.c``) against torch's op chains they replace,
and the model's use of them."""

import pytest
import torch
import torch.nn.functional as F

from agentlang.runtime.models.rope import RotaryEmbedding
from agentlang.runtime.quant.native.elementwise import Elementwise


def close(out, ref):
    """Equal but for rare last-bit differences (torch sums and exponentiates in another order)."""
    assert out.dtype == ref.dtype == torch.bfloat16 and out.shape == ref.shape
    differ = (out != ref).float().mean().item()
    rel = ((out.float() - ref.float()).abs() / ref.float().abs().clamp_min(1e-2)).max().item()
    assert differ < 0.01 and rel <= 2 ** -7, (differ, rel)


@pytest.mark.parametrize("n", [576, 40, 1000, 7])
def test_rmsnorm_with_and_without_the_residual(native_lib, n):
    ew = Elementwise(native_lib)
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(33, n, generator=g) * 3).bfloat16()
    w = torch.randn(n, generator=g).bfloat16()
    h = torch.randn(33, n, generator=g).bfloat16()
    close(ew.rmsnorm(x.clone(), w, 1e-5), w * F.rms_norm(x.float(), (n,), eps=1e-5).bfloat16())
    x2 = x.clone()
    out = ew.rmsnorm(x2, w, 1e-5, residual=h)
    assert torch.equal(x2, x + h)                       # the add, in place, rounded as torch's
    close(out, w * F.rms_norm((x + h).float(), (n,), eps=1e-5).bfloat16())


@pytest.mark.parametrize("inter", [1536, 24, 13])
def test_silu_mul(native_lib, inter):
    gu = (torch.randn(19, 2 * inter, generator=torch.Generator().manual_seed(inter)) * 4).bfloat16()
    gate, up = gu.chunk(2, dim=-1)
    close(Elementwise(native_lib).silu_mul(gu), F.silu(gate) * up)


@pytest.mark.parametrize("d", [64, 128, 20])
def test_rope_on_a_slice_of_the_fused_projection(native_lib, d):
    rope = RotaryEmbedding(d, 4096, 10000.0, None)
    g = torch.Generator().manual_seed(d)
    qkv = torch.randn(21, 13 * d, generator=g).bfloat16()
    x = qkv[:, : 11 * d].view(21, 11, d)                                 # rows 13 d apart
    cos, ssin = rope.cos_sin(torch.randint(0, 4000, (21,), generator=g), torch.bfloat16)
    out = Elementwise(native_lib).rope(x, cos, ssin)
    close(out, x * cos + torch.roll(x, d // 2, dims=-1) * ssin)
    assert out.is_contiguous()


def test_bad_inputs_name_what_is_wrong(native_lib):
    ew = Elementwise(native_lib)
    with pytest.raises(ValueError, match="contiguous bfloat16"):
        ew.rmsnorm(torch.zeros(2, 8), torch.zeros(8), 1e-5)
    with pytest.raises(ValueError, match=r"weight must be \[8\]"):
        ew.rmsnorm(torch.zeros(2, 8).bfloat16(), torch.zeros(4).bfloat16(), 1e-5)
    with pytest.raises(ValueError, match=r"\[T, 2I\]"):
        ew.silu_mul(torch.zeros(2, 7).bfloat16())
    with pytest.raises(ValueError, match="rope"):
        ew.rope(torch.zeros(2, 3, 8).bfloat16(), torch.zeros(2, 1, 4).bfloat16(),
                torch.zeros(2, 1, 4).bfloat16())


def test_bf16_model_with_the_kernels_as_with_torchs_ops(model_path, prompt_ids, monkeypatch):
    """The embedded model in bf16, prefill + a decode step of 3 prompts, with the native
    element-wise kernels (and the paged decode attention) and with torch's ops: the same
    greedy tokens, logits within bf16's rounding; the kernels were used."""
    from agentlang.runtime.attention import torch_backend
    from agentlang.runtime.attention.forward_batch import build_forward_batch
    from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
    from agentlang.runtime.models import llama, rope
    from agentlang.runtime.quant.native.elementwise import elementwise

    native = elementwise()
    if native is None:
        pytest.skip("no native build runs here")
    model = llama.LlamaModel.from_pretrained(model_path, dtype=torch.bfloat16)
    cfg, seqs = model.config, prompt_ids[:3]

    def run():
        pool = KVPool(KVLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16),
                      16, num_pages=32)
        tables = [list(range(8 * i, 8 * i + 8)) for i in range(len(seqs))]
        backend = torch_backend.TorchAttentionBackend()
        first = model(build_forward_batch(seqs, [0] * 3, tables, 16), pool, backend)
        nxt = [[int(t)] for t in first.argmax(-1)]
        second = model(build_forward_batch(nxt, [len(s) for s in seqs], tables, 16), pool, backend)
        return torch.cat([first, second])

    calls = []

    class Spy:                       # the kernels, recording which were asked for
        applies = staticmethod(native.applies)

        def __getattr__(self, name):
            calls.append(name)
            return getattr(native, name)
    monkeypatch.setattr(llama, "elementwise", Spy)
    monkeypatch.setattr(rope, "elementwise", Spy)
    with_kernels = run()
    assert {"rmsnorm", "silu_mul", "rope"} <= set(calls)
    monkeypatch.setattr(llama, "elementwise", lambda: None)
    monkeypatch.setattr(rope, "elementwise", lambda: None)
    monkeypatch.setattr(torch_backend, "qmatmul_library", lambda: None)
    with_torch = run()
    assert torch.equal(with_kernels.argmax(-1), with_torch.argmax(-1))
    diff = (with_kernels - with_torch).abs().max().item()
    assert diff < 0.03 * with_torch.abs().max().item()
