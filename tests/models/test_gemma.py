"""Gemma 2 and Gemma 3 text models against HF transformers: logits on small random models
(fp32, 1e-3 as every family) from HF directories and from GGUF files of the same weights, and
greedy outputs invariant to batching, cache state, page size, chunked prefill, preemption and
forks — every prompt longer than the sliding window, so the sliding layers' window binds.

The shapes make each Gemma feature show: a window of 8 keys, a pattern mixing sliding and
global layers, Gemma 3's two RoPE bases (1M linear-scaled x2 globally, 10k in the window) and
q/k norms, Gemma 2's soft caps small enough to bite (scores 5, logits 3), a query scalar that is
not the head dim, random norm weights (HF's ``1 + w``)."""

import json
import math
import shutil

import pytest
import torch

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.models.config import LlamaConfig
from agentlang.runtime.models.gguf_model import load_gguf_model
from agentlang.runtime.models.llama import LlamaModel
from agentlang.runtime.weights.model_loader import ModelLoadError
from tests.models.test_families import ForwardOracle, check_gguf, check_invariance, hf_last
from tests.models.test_model_fidelity import run_prefill
from tests.support.gguf_convert import hf_to_gguf
from tests.support.gguf_files import gguf_tokenizer_fields
from tests.support.models import family_dirs, hf_models

pytestmark = pytest.mark.slow

WINDOW = 8
SMALL = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, intermediate_size=128, max_position_embeddings=256,
             sliding_window=WINDOW)
FAMILIES = {
    "gemma2": ("gemma2", dict(SMALL, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
                              final_logit_softcapping=3.0)),
    "gemma3": ("gemma3", dict(SMALL, query_pre_attn_scalar=24,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              rope_parameters={
                                  "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                     "rope_theta": 1_000_000.0},
                                  "sliding_attention": {"rope_type": "default",
                                                        "rope_theta": 10_000.0}})),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return family_dirs(tmp_path_factory, FAMILIES)


@pytest.fixture(scope="module")
def hf(dirs):
    return hf_models(dirs, attn_implementation="eager")


def prompts(n: int = 3, length: int = 3 * WINDOW + 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, 2000, (length + 3 * i,), generator=g).tolist() for i in range(n)]


def test_config_fields(dirs):
    g2, g3 = LlamaConfig.from_dir(dirs["gemma2"]), LlamaConfig.from_dir(dirs["gemma3"])
    assert g2.layer_windows == (WINDOW, 0, WINDOW) and g3.layer_windows == (WINDOW, WINDOW, 0)
    assert (g2.attn_softcap, g2.final_softcap) == (5.0, 3.0) and not g3.attn_softcap
    assert g2.attn_scale == g3.attn_scale == 24 ** -0.5
    assert g3.qk_norm and not g2.qk_norm and g2.sandwich_norms and g2.hidden_act == "gelu_tanh"
    assert g3.rope_theta == 1e6 and g3.rope_scaling["factor"] == 2.0 and g3.local_rope_theta == 1e4
    assert g2.tie_word_embeddings and g2.embed_scale == 8.0


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("page_size", [1, 16])
def test_logits_match_hf_alone_and_batched(dirs, hf, name, page_size):
    ours = LlamaModel.from_pretrained(dirs[name])
    seqs = prompts()
    batched = run_prefill(ours, seqs, page_size, shuffle=True)
    for i, s in enumerate(seqs):
        ref = hf_last(hf[name], s)
        assert (run_prefill(ours, [s], page_size)[0] - ref).abs().max().item() <= 1e-3
        assert (batched[i] - ref).abs().max().item() <= 1e-3


def test_each_feature_changes_the_logits(dirs, hf):
    """The window, the caps and the local RoPE base each matter at these shapes (so the
    fidelity test above would catch a path that ignored one)."""
    seq = prompts(1)[0]
    for name, change in (("gemma2", "window"), ("gemma2", "softcap"), ("gemma3", "window"),
                         ("gemma3", "local_rope")):
        model = LlamaModel.from_pretrained(dirs[name])
        ref = hf_last(hf[name], seq)
        for layer in model.layers:
            if change == "window":
                layer.self_attn.window = 0
            elif change == "softcap":
                layer.self_attn.softcap = 0.0
        if change == "local_rope":
            model.local_rope = None
        assert (run_prefill(model, [seq], 16)[0] - ref).abs().max().item() > 1e-2, (name, change)


N_NEW = 16


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_invariant_to_batching_cache_chunking_preemption_and_forks(dirs, hf, name):
    from transformers import AutoTokenizer

    oracle = ForwardOracle(hf[name], AutoTokenizer.from_pretrained(dirs[name]))
    seqs = prompts(4)
    ref = [list(oracle.continuation(tuple(s), N_NEW)) for s in seqs]
    params = SamplingParams(max_tokens=N_NEW, temperature=0, ignore_eos=True)
    check = check_invariance(str(dirs[name]), oracle, seqs, ref, N_NEW)
    tight = Engine(str(dirs[name]), page_size=4, num_pages=24, max_batch_tokens=256)
    check(tight.generate(seqs, params), "preemption")
    assert tight.metrics()["preemptions"] > 0, "the KV budget did not force preemption"
    tight.flush_cache()
    assert tight.allocator.num_free == tight.allocator.num_pages
    # forks: n samples of one prompt share its pages copy-on-write; greedy, all equal the oracle
    forked = Engine(str(dirs[name]), page_size=4, kv_budget_mb=32).generate(
        seqs[0], SamplingParams(max_tokens=N_NEW, temperature=0, ignore_eos=True, n=3))
    assert len(forked.outputs) == 3
    for o in forked.outputs:
        oracle.assert_same(seqs[0], o.token_ids, ref[0], "forks n=3")


@pytest.fixture(scope="module")
def gguf_dirs(tmp_path_factory):
    """The families with the tiny GGUF tokenizer's vocabulary and the query scalar llama.cpp
    assumes for files (the head dim: GGUF has no field for it)."""
    vocab = len(gguf_tokenizer_fields()["tokenizer.ggml.tokens"])
    return family_dirs(tmp_path_factory, FAMILIES, "g_", seed=3, query_pre_attn_scalar=16,
                       vocab_size=vocab)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_gguf_matches_hf_and_quantized_matches_decoded(gguf_dirs, tmp_path, name):
    seqs = [[(7 * i + j) % 250 + 3 for j in range(3 * WINDOW + i)] for i in range(2)]
    # Gemma's layers run in the C decode layer too (sandwich norms, GeGLU, windows, caps)
    f32 = check_gguf(gguf_dirs[name], tmp_path, seqs, native=True, attn_implementation="eager")
    assert f32.config.layer_windows == LlamaConfig.from_dir(gguf_dirs[name]).layer_windows


def rewrite_config(src, dst, **changes):
    d = shutil.copytree(src, dst)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **changes}))
    return d


def test_bad_config_values_are_named(dirs, tmp_path):
    """Contradicting layer types, a window past the context, caps that are not finite: a
    clear error naming the field, before any weight is read."""
    src = dirs["gemma2"]
    cases = [
        (dict(layer_types=["sliding_attention"] * 2), "layer_types has 2 entries but num_hidden_layers is 3"),
        (dict(layer_types=["sliding_attention", "local", "full_attention"]), r"layer_types: \['local'\]"),
        (dict(sliding_window=1024), "sliding_window 1024 is larger than the context"),
        (dict(sliding_window=0), "sliding_window 0"),
        (dict(attn_logit_softcapping=math.inf), "attn_logit_softcapping inf"),
        (dict(final_logit_softcapping=-1.0), "final_logit_softcapping -1.0"),
        (dict(hidden_activation="relu"), "hidden_activation 'relu'"),
    ]
    for i, (change, message) in enumerate(cases):
        with pytest.raises(ModelLoadError, match=message):
            LlamaModel.from_pretrained(rewrite_config(src, tmp_path / str(i), **change))


def test_bad_gguf_pattern_is_named(gguf_dirs, tmp_path):
    """A GGUF whose per-layer window pattern has more entries than the file has layers."""
    import gguf

    src = hf_to_gguf(gguf_dirs["gemma3"], tmp_path / "g.gguf", gguf_tokenizer_fields())
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "gemma3")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.name == "gemma3.attention.sliding_window_pattern":
            w.add_array(f.name, [True, True, False, True])
            continue
        w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="layer_types has 4 entries but num_hidden_layers is 3"):
        load_gguf_model(tmp_path / "bad.gguf")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_native_decode_layer_matches_the_torch_layers(gguf_dirs, tmp_path, name):
    """Decode steps past the window in one C call a layer vs the torch layers (Q8_0 file):
    logits to float32 rounding, the same argmax."""
    from agentlang.runtime.quant.native import qmatmul_library
    from tests.models.test_native_decode import decode, setup

    if qmatmul_library() is None:
        pytest.skip("no native library on this machine")
    path = hf_to_gguf(gguf_dirs[name], tmp_path / "q8.gguf", gguf_tokenizer_fields(), "Q8_0")
    model = load_gguf_model(path, "auto", torch.float32)
    assert model.native_decoder is not None
    prompts = [[(5 * i + j) % 200 + 3 for j in range(3 * WINDOW + 2 * i)] for i in range(3)]
    pool, tables = setup(model, prompts)
    fast = decode(model, pool, tables, prompts, [11, 12, 13], native=True)
    pool2, tables2 = setup(model, prompts)
    slow = decode(model, pool2, tables2, prompts, [11, 12, 13], native=False)
    assert ((fast - slow).norm() / slow.norm()).item() < 1e-4
    assert torch.equal(fast.argmax(-1), slow.argmax(-1))
