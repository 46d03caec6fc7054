"""Decode steps in one native call per layer (``runtime/models/decode_layer.py``) against the same
model's torch layers: logits and stored K/V agree to float32 rounding, a sequence's result is
bitwise the same alone or batched, and steps the native path does not serve fall back. Each
with the pool storing float32 (``kv_dtype`` auto) and bfloat16 (``kv_dtype="bfloat16"``)."""

import random

import pytest
import torch

from agentlang.runtime.attention import decode_plan
from agentlang.runtime.attention.torch_backend import TorchAttentionBackend
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.models import decode_layer
from agentlang.runtime.models.gguf_model import load_gguf_model
from agentlang.runtime.quant.native import qmatmul_library
from tests.support.gguf_files import write_gguf

PS = 4
KV = pytest.mark.parametrize("kv", ["auto", "bfloat16"])    # the pool's storage
PROMPTS = [[5, 17, 99, 3, 42, 8], list(range(60, 100)), [7, 8, 9]]


@pytest.fixture(scope="module")
def lib():
    if qmatmul_library() is None:
        pytest.skip("no native library on this machine (agentlang.runtime.quant.native logs why)")
    return qmatmul_library()


def setup(model, prompts, kv="auto", room=4, pages=64):
    """Prefill ``prompts`` (torch layers) into a float32 model's pool of ``pages`` pages
    storing ``kv``, shuffled, each with ``room`` more positions; returns the pool and the page
    tables."""
    cfg = model.config
    pool = KVPool(KVLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32, kv),
                  PS, num_pages=pages)
    ids = list(range(1, pages))
    random.Random(0).shuffle(ids)
    tables, at = [], 0
    for p in prompts:
        n = -(-(len(p) + room) // PS)
        tables.append(ids[at:at + n])
        at += n
    model(build_forward_batch(prompts, [0] * len(prompts), tables, PS), pool,
          TorchAttentionBackend())
    return pool, tables


def decode(model, pool, tables, prompts, tokens, native: bool):
    batch = build_forward_batch([[t] for t in tokens], [len(p) for p in prompts], tables, PS)
    keep = model.native_decoder
    model.native_decoder = keep if native else None
    try:
        return model(batch, pool, TorchAttentionBackend())
    finally:
        model.native_decoder = keep


@KV
@pytest.mark.parametrize("qtype,arch,tied", [("Q4_1", "llama", True), ("Q4_0", "qwen2", False),
                                             ("Q8_0", "llama", False)])
def test_native_decode_matches_the_torch_layers(tmp_path, tokenizer_fields, lib, qtype, arch, tied,
                                                kv):
    path = write_gguf(tmp_path / "m.gguf", tokenizer_fields, qtype, arch, tied=tied)
    model = load_gguf_model(path, "auto", torch.float32)
    assert model.native_decoder is not None
    pool, tables = setup(model, PROMPTS, kv)
    tokens = [11, 12, 13]
    fast = decode(model, pool, tables, PROMPTS, tokens, native=True)
    slots = build_forward_batch([[t] for t in tokens], [len(p) for p in PROMPTS], tables,
                                PS).slot_mapping
    kv_fast = pool.buffer.view(model.config.num_layers, 2, -1, pool.buffer.shape[-2] *
                               pool.buffer.shape[-1])[:, :, slots].float()
    slow = decode(model, pool, tables, PROMPTS, tokens, native=False)
    kv_slow = pool.buffer.view(*kv_fast.shape[:2], -1, kv_fast.shape[-1])[:, :, slots].float()
    # float32 rounding differences (norm, attention order) re-quantized: Q8's 16-bit activation
    # grid turns them into ~4e-5 on this random model, Q4's 8-bit grid into ~2e-7
    assert ((fast - slow).norm() / slow.norm()).item() < 1e-4, "logits differ"
    if kv == "auto":
        assert ((kv_fast - kv_slow).norm() / kv_slow.norm()).item() < 1e-4, "stored K/V differ"
    else:   # each path rounds its float32 value once: where those straddle a rounding
        # boundary, the stored values are one bfloat16 step (<= 2^-7 relative) apart, plus
        # the float32 values' own difference (near zero)
        bound = kv_slow.abs() * 2**-7 + 1e-4 * kv_slow.abs().max()
        assert ((kv_fast - kv_slow).abs() <= bound).all(), "stored K/V differ"
        assert (kv_fast == kv_slow).float().mean().item() > 0.99
    assert torch.equal(fast.argmax(-1), slow.argmax(-1))


@KV
def test_a_sequence_decodes_the_same_alone_and_batched(tmp_path, tokenizer_fields, lib, kv):
    path = write_gguf(tmp_path / "m.gguf", tokenizer_fields, "Q4_1")
    model = load_gguf_model(path, "auto", torch.float32)
    pool, tables = setup(model, PROMPTS, kv)
    together = decode(model, pool, tables, PROMPTS, [11, 12, 13], native=True)
    for b in range(3):
        alone = decode(model, pool, tables[b:b + 1], PROMPTS[b:b + 1], [11 + b], native=True)
        assert torch.equal(alone[0], together[b])


@KV
@pytest.mark.parametrize("head_dim", [16, 24])     # 24: not a multiple of AVX-512's 16 lanes
def test_rows_of_a_sequence_match_one_token_steps_bitwise(tmp_path, tokenizer_fields, lib,
                                                          head_dim, kv):
    """Several new tokens of a sequence in one native step (a verify: consecutive rows whose
    query heads are attended together, reading each key once) give bit for bit the logits of
    one-token steps, beside other sequences, at one thread or two."""
    path = write_gguf(tmp_path / "m.gguf", tokenizer_fields, "Q4_1",
                      dims=(4 * head_dim, 128, 4, 2, head_dim))
    model = load_gguf_model(path, "auto", torch.float32)
    new = [[11, 12, 13, 14, 15, 16, 17, 18, 19], list(range(21, 38)), [31]]
    lens = [len(p) for p in PROMPTS]
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            pool, tables = setup(model, PROMPTS, kv, room=17)
            batch = build_forward_batch(new, lens, tables, PS,
                                        logits_rows=[list(range(len(t))) for t in new])
            assert model.native_decoder.serves(batch, pool, TorchAttentionBackend())
            together = model(batch, pool, TorchAttentionBackend())
            pool, tables = setup(model, PROMPTS, kv, room=17)
            rows = {}
            for i in range(max(map(len, new))):
                live = [b for b in range(3) if i < len(new[b])]
                out = model(build_forward_batch([[new[b][i]] for b in live],
                                                [lens[b] + i for b in live],
                                                [tables[b] for b in live], PS),
                            pool, TorchAttentionBackend())
                rows.update({(b, i): out[j] for j, b in enumerate(live)})
            at = 0
            for b, toks in enumerate(new):
                for i in range(len(toks)):
                    assert torch.equal(together[at], rows[b, i]), (n, b, i)
                    at += 1
    finally:
        torch.set_num_threads(threads)


@KV
def test_a_prefill_in_the_native_layer_is_its_tokens_decoded_one_by_one(tmp_path,
                                                                        tokenizer_fields, lib, kv):
    """A prompt's prefill runs in the C layer as rows of a decode each (its per-row steps on
    every thread from 16 rows): its last logits and every K/V it stores are bit for bit those
    of feeding the prompt one token a step, at one thread or two, and near the torch layers'."""
    path = write_gguf(tmp_path / "m.gguf", tokenizer_fields, "Q4_1")
    model = load_gguf_model(path, "auto", torch.float32)
    prompt = PROMPTS[1]                                            # 40 tokens
    cfg = model.config
    runs = {}
    threads = torch.get_num_threads()
    for how in ("native", "native 1 thread", "steps", "torch"):
        torch.set_num_threads(1 if how == "native 1 thread" else threads)
        pool = KVPool(KVLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32,
                               kv), PS, num_pages=16)
        table = [list(range(3, 14))]
        keep = model.native_decoder
        model.native_decoder = None if how == "torch" else keep
        try:
            if how == "steps":
                for i, t in enumerate(prompt):
                    out = model(build_forward_batch([[t]], [i], table, PS), pool,
                                TorchAttentionBackend())
            else:
                batch = build_forward_batch([prompt], [0], table, PS)
                assert keep.serves(batch, pool, TorchAttentionBackend())
                out = model(batch, pool, TorchAttentionBackend())
        finally:
            model.native_decoder = keep
            torch.set_num_threads(threads)
        runs[how] = (out[-1], pool.buffer.clone())
    for other in ("steps", "native 1 thread"):
        assert torch.equal(runs["native"][0], runs[other][0]), other
        assert torch.equal(runs["native"][1], runs[other][1]), other
    fast, slow = runs["native"][0], runs["torch"][0]
    assert ((fast - slow).norm() / slow.norm()).item() < 1e-4

@KV
def test_long_contexts_match_across_the_attention_task_cuts_bitwise(tmp_path, tokenizer_fields,
                                                                     lib, kv):
    """Past 512 keys, a step of few tasks (a sequence alone, or its verify rows) attends in
    phases: scores by chunks of keys, values by chunks of lanes, spread over the threads. Its
    logits are bit for bit those of the whole-task cut (one thread, or a batch of many
    sequences) and of one-token steps; and near the torch layers'."""
    path = write_gguf(tmp_path / "m.gguf", tokenizer_fields, "Q4_1", dims=(128, 128, 4, 2, 32),
                      context=1024)
    model = load_gguf_model(path, "auto", torch.float32)
    vocab = model.config.vocab_size
    prompts = [[(7 * i + 3) % vocab for i in range(n)] for n in (700, 530, 600, 520)]
    lens = [len(p) for p in prompts]
    new = [list(range(11, 16)), list(range(21, 30))]     # 5 rows: one task a head; 9: two
    threads = torch.get_num_threads()
    try:
        out = {}
        for n in (1, 2):
            torch.set_num_threads(n)
            pool, tables = setup(model, prompts, kv, room=9, pages=800)
            alone = [decode(model, pool, tables[b:b + 1], prompts[b:b + 1], [40 + b], True)[0]
                     for b in range(4)]
            batched = decode(model, pool, tables, prompts, [40, 41, 42, 43], True)
            for b in range(4):
                assert torch.equal(alone[b], batched[b]), (n, b)
            out[n, "alone"] = alone
            for b, toks in enumerate(new):
                pool, tables = setup(model, prompts, kv, room=9, pages=800)
                rows = model(build_forward_batch([toks], [lens[b]], tables[b:b + 1], PS,
                                                 logits_rows=[list(range(len(toks)))]),
                             pool, TorchAttentionBackend())
                pool, tables = setup(model, prompts, kv, room=9, pages=800)
                for i, t in enumerate(toks):
                    one = model(build_forward_batch([[t]], [lens[b] + i], tables[b:b + 1], PS),
                                pool, TorchAttentionBackend())
                    assert torch.equal(rows[i], one[0]), (n, b, i)
        for b in range(4):
            assert torch.equal(out[1, "alone"][b], out[2, "alone"][b]), b
        pool, tables = setup(model, prompts, kv, room=9, pages=800)
        slow = decode(model, pool, tables[:1], prompts[:1], [40], native=False)[0]
        assert ((out[2, "alone"][0] - slow).norm() / slow.norm()).item() < 1e-4
    finally:
        torch.set_num_threads(threads)


def test_steps_it_does_not_serve_run_the_torch_layers(tmp_path, tokenizer_fields, lib,
                                                     monkeypatch):
    path = write_gguf(tmp_path / "m.gguf", tokenizer_fields, "Q4_1")
    model = load_gguf_model(path, "auto", torch.float32)
    dec = model.native_decoder
    pool, tables = setup(model, PROMPTS)
    prefill = build_forward_batch(PROMPTS, [0] * 3, tables, PS)
    assert dec.serves(prefill, pool, TorchAttentionBackend())              # chunks of prompts
    monkeypatch.setattr(decode_layer, "MAX_ROWS", 39)
    assert not dec.serves(prefill, pool, TorchAttentionBackend())          # 40 > MAX_ROWS
    monkeypatch.undo()
    dec.linear.bf16_gemm_rows = 49                    # the engine's bf16_gemm_rows: 49 tokens
    assert dec.serves(build_forward_batch(PROMPTS[1:], [0] * 2, tables[1:], PS), pool,
                      TorchAttentionBackend())                             # 43 tokens
    assert not dec.serves(prefill, pool, TorchAttentionBackend())          # 49: bf16 GEMMs
    dec.linear.bf16_gemm_rows = None
    step = build_forward_batch([[1]] * 3, [len(p) for p in PROMPTS], tables, PS)
    assert dec.serves(step, pool, TorchAttentionBackend())
    bf16 = KVPool(KVLayout(model.config.num_layers, model.config.num_kv_heads,
                           model.config.head_dim, torch.bfloat16), PS, num_pages=8)
    assert not dec.serves(step, bf16, TorchAttentionBackend())             # a bf16 model's pool
    narrow = KVPool(KVLayout(model.config.num_layers, model.config.num_kv_heads,
                             model.config.head_dim, torch.float32, "bfloat16"), PS, num_pages=8)
    assert dec.serves(step, narrow, TorchAttentionBackend())      # float32 model, bf16 storage
    int8 = KVPool(KVLayout(model.config.num_layers, model.config.num_kv_heads,
                           model.config.head_dim, torch.float32, "int8"), PS, num_pages=8)
    assert not dec.serves(step, int8, TorchAttentionBackend())              # quantized pool
    shared = build_forward_batch([[1]] * 2, [9, 10], [tables[1][:3], tables[1][:3]], PS)
    assert dec.serves(shared, pool, TorchAttentionBackend())   # too few shared keys to cascade
    monkeypatch.setattr(decode_plan, "CASCADE_MIN_KEYS", {})   # any shared pages: a cascade
    shared = build_forward_batch([[1]] * 2, [9, 10], [tables[1][:3], tables[1][:3]], PS)
    assert not dec.serves(shared, pool, TorchAttentionBackend())   # shared pages: cascade path
    assert load_gguf_model(path, "auto", torch.bfloat16).native_decoder is None
    assert load_gguf_model(path, "auto", torch.float32, kernels="torch").native_decoder is None


@pytest.mark.parametrize("family,shapes", [
    ("qwen3", dict(head_dim=32)),                                    # q/k norms
    ("phi3", dict(partial_rotary_factor=0.75, sliding_window=None)),  # partial rotary
])
def test_qk_norms_and_partial_rotary_run_natively(tmp_path, tokenizer_fields, lib, family, shapes):
    from agentlang.runtime.weights.model_loader import resolve_model
    from tests.support.gguf_convert import hf_to_gguf
    from tests.support.models import random_hf_model

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, intermediate_size=128,
                 tie_word_embeddings=False, max_position_embeddings=256,
                 vocab_size=len(tokenizer_fields["tokenizer.ggml.tokens"]))
    d = random_hf_model(family, resolve_model().path, tmp_path / "hf", **{**small, **shapes})
    model = load_gguf_model(hf_to_gguf(d, tmp_path / "m.gguf", tokenizer_fields, "Q8_0"), "auto")
    assert model.native_decoder is not None
    pool, tables = setup(model, PROMPTS)
    fast = decode(model, pool, tables, PROMPTS, [11, 12, 13], native=True)
    slow = decode(model, pool, tables, PROMPTS, [11, 12, 13], native=False)
    assert ((fast - slow).norm() / slow.norm()).item() < 1e-4
    assert torch.equal(fast.argmax(-1), slow.argmax(-1))


def test_the_layers_run_in_one_call_and_stop_only_for_a_pending_arrival(tmp_path,
                                                                        tokenizer_fields, lib):
    """A native step runs every layer in one call; it stops between two layers only while the
    hook's ``pending`` flag is set (the engine's arrivals, ``layer_break.BetweenLayers``), and
    after every layer for a hook without one. The hidden states are the same either way."""
    import ctypes

    path = write_gguf(tmp_path / "m.gguf", tokenizer_fields, "Q4_1")
    model = load_gguf_model(path, "auto", torch.float32)
    n = model.config.num_layers                         # 2: one point between layers

    class Hook:
        def __init__(self, pending, set_again=0):
            self.pending, self.calls, self.again = pending, 0, set_again

        def __call__(self):
            self.calls += 1
            if getattr(self, "pending", None) is not None:
                self.pending.value = 1 if self.calls <= self.again else 0   # taken

    def run(hook):
        pool, tables = setup(model, PROMPTS)
        batch = build_forward_batch([[11], [12], [13]], [len(p) for p in PROMPTS], tables, PS)
        x = model.embed_tokens(batch.input_ids)
        step = model.native_decoder.step(batch, pool, model.rope.cos_sin(batch.positions, x.dtype))
        return model.native_decoder.run(x.clone(), step, hook)

    ref = run(None)
    idle = Hook(ctypes.c_int32(0))
    assert torch.equal(run(idle), ref) and idle.calls == 0
    once = Hook(ctypes.c_int32(1))                      # an arrival before the first layer
    assert torch.equal(run(once), ref) and once.calls == 1
    again = Hook(ctypes.c_int32(1), set_again=1)        # another one during the break:
    assert torch.equal(run(again), ref) and again.calls == 1      # no break after the last
    plain = Hook(None)
    del plain.pending                                   # a hook without the flag
    assert torch.equal(run(plain), ref) and plain.calls == n - 1
