"""Qwen3 (q/k norms) and Phi-3 / Phi-4-mini (fused projections, partial rotary, long-RoPE)
against HF transformers: logits on small random models (fp32, 1e-3 as for Llama), from HF
directories and from GGUF files of the same weights, and greedy outputs invariant to batching,
cache state, page size and chunking.

HF's own GGUF loader cannot read these files (it ignores Qwen3's ``attention.key_length`` and
builds Phi-3 with an out-of-range pad token), so the GGUF oracle is HF running the HF directory
the file was converted from (:mod:`tests.support.gguf_convert`)."""

import numpy as np
import pytest
import torch

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.models.config import LlamaConfig
from agentlang.runtime.models.gguf_model import load_gguf_model
from agentlang.runtime.models.llama import LlamaModel
from agentlang.runtime.weights.model_loader import ModelLoadError
from tests.conftest import GreedyOracle
from tests.models.test_model_fidelity import run_prefill
from tests.support.gguf_convert import hf_to_gguf
from tests.support.gguf_files import gguf_tokenizer_fields
from tests.support.models import family_dirs, hf_models

pytestmark = pytest.mark.slow

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, intermediate_size=128, tie_word_embeddings=False)
ORIG = 32                                    # the long-RoPE models' original context
LONGROPE = {"type": "longrope", "long_factor": [1.0 + 0.3 * i for i in range(6)],
            "short_factor": [1.0 + 0.05 * i for i in range(6)]}
FAMILIES = {
    "qwen3": ("qwen3", dict(SMALL, head_dim=32, max_position_embeddings=256)),
    "phi3": ("phi3", dict(SMALL, max_position_embeddings=256, sliding_window=None)),
    # Phi-4-mini's layout: 3/4 of each head rotated, long-RoPE served at the original context
    "phi4_short": ("phi3", dict(SMALL, partial_rotary_factor=0.75, max_position_embeddings=ORIG,
                                original_max_position_embeddings=ORIG, rope_scaling=LONGROPE,
                                sliding_window=None)),
    # ... and served beyond it: the long factors, for every position
    "phi4_long": ("phi3", dict(SMALL, partial_rotary_factor=0.75, max_position_embeddings=4 * ORIG,
                               original_max_position_embeddings=ORIG, rope_scaling=LONGROPE,
                               sliding_window=None)),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return family_dirs(tmp_path_factory, FAMILIES)


@pytest.fixture(scope="module")
def hf(dirs):
    return hf_models(dirs)


def prompts(name: str, n: int = 3) -> list[list[int]]:
    """Random token prompts; long-RoPE-beyond-context models get prompts past ORIG (where HF's
    no-cache forward also uses the long factors)."""
    g = torch.Generator().manual_seed(7)
    base = ORIG + 3 if name == "phi4_long" else 11
    length = min(base, FAMILIES[name][1]["max_position_embeddings"] - 8)
    return [torch.randint(0, 2000, (length + 2 * i,), generator=g).tolist() for i in range(n)]


def hf_last(model, seq):
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, -1]


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("page_size", [1, 16])
def test_logits_match_hf_alone_and_batched(dirs, hf, name, page_size):
    ours = LlamaModel.from_pretrained(dirs[name])
    seqs = prompts(name)
    batched = run_prefill(ours, seqs, page_size, shuffle=True)
    for i, s in enumerate(seqs):
        ref = hf_last(hf[name], s)
        assert (run_prefill(ours, [s], page_size)[0] - ref).abs().max().item() <= 1e-3
        assert (batched[i] - ref).abs().max().item() <= 1e-3


def test_config_fields(dirs):
    qwen3, phi4 = LlamaConfig.from_dir(dirs["qwen3"]), LlamaConfig.from_dir(dirs["phi4_long"])
    assert qwen3.qk_norm and qwen3.head_dim == 32 and not qwen3.attention_bias
    assert phi4.rope_dim == 12 and phi4.rope_scaling["long"]
    assert not LlamaConfig.from_dir(dirs["phi4_short"]).rope_scaling["long"]


def test_long_factors_differ_from_short(dirs, hf):
    """The factor set matters: a model served past its original context rotates every
    position with the long factors, so a prompt shorter than ORIG no longer gives HF's
    short-factor logits (it gives what it gives inside a longer sequence)."""
    ours = LlamaModel.from_pretrained(dirs["phi4_long"])
    short = list(range(40, 40 + ORIG // 2))
    assert (run_prefill(ours, [short], 16)[0] - hf_last(hf["phi4_long"], short)).abs().max() > 1e-2


def test_phi3_sliding_window_caps_the_context(dirs, tmp_path):
    import json
    import shutil

    d = shutil.copytree(dirs["phi3"], tmp_path / "w")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "sliding_window": 100}))
    assert LlamaConfig.from_dir(d).max_position_embeddings == 100


def test_bad_partial_rotary_and_factors_named(dirs):
    cfg = {"architectures": ["Phi3ForCausalLM"], "vocab_size": 10, "hidden_size": 64,
           "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4}
    with pytest.raises(ModelLoadError, match="partial_rotary_factor 1.5"):
        LlamaConfig.from_dict({**cfg, "partial_rotary_factor": 1.5})
    bad = {"rope_type": "longrope", "long_factor": [1.0] * 3, "short_factor": [1.0] * 8,
           "original_max_position_embeddings": 16}
    with pytest.raises(ModelLoadError, match="long_factor: 3 values.*need 8"):
        LlamaConfig.from_dict({**cfg, "max_position_embeddings": 64, "rope_scaling": bad})


@pytest.fixture(scope="module")
def gguf_dirs(tmp_path_factory):
    """The families with the tiny GGUF tokenizer's vocabulary, as HF dirs (the GGUF oracle)."""
    vocab = len(gguf_tokenizer_fields()["tokenizer.ggml.tokens"])
    return family_dirs(tmp_path_factory, {n: FAMILIES[n] for n in ("qwen3", "phi4_long")},
                       "g_", seed=3, vocab_size=vocab)


@pytest.mark.parametrize("name", ["qwen3", "phi4_long"])
def test_gguf_matches_hf_and_quantized_matches_decoded(gguf_dirs, tmp_path, name):
    seqs = [[(7 * i + j) % 250 + 3 for j in range(ORIG + 5 + i)] for i in range(2)]
    # q/k norms and partial rotary are the C decode layer's too
    check_gguf(gguf_dirs[name], tmp_path, seqs, native=True)


def check_gguf(hf_dir, tmp_path, seqs, native: bool, **hf_kwargs):
    """The GGUF of ``hf_dir`` in F32 gives HF's last logits of ``seqs`` (1e-3); its Q8_0 and
    Q4_1 files kept quantized give their own decoded weights' (2e-3 relative), with the native
    decode layer built or not as ``native`` says. Returns the F32 model."""
    from transformers import AutoModelForCausalLM

    from tests.weights.test_gguf_loading import prefill_logits

    ref = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, **hf_kwargs).eval()
    f32 = load_gguf_model(hf_to_gguf(hf_dir, tmp_path / "f32.gguf", gguf_tokenizer_fields()))
    got = prefill_logits(f32, seqs)
    for i, s in enumerate(seqs):
        assert (got[i] - hf_last(ref, s)).abs().max().item() <= 1e-3
    for qtype in ("Q8_0", "Q4_1"):
        path = hf_to_gguf(hf_dir, tmp_path / f"{qtype}.gguf", gguf_tokenizer_fields(), qtype)
        auto, dense = load_gguf_model(path, "auto"), load_gguf_model(path, "dense")
        assert dense.weights_report == {qtype: "dense float32"}
        assert (auto.native_decoder is not None) == native
        a, d = prefill_logits(auto, seqs), prefill_logits(dense, seqs)
        assert (a - d).abs().max().item() <= 2e-3 * d.abs().max().item()
    return f32


N_NEW = 20


class ForwardOracle(GreedyOracle):
    """Greedy continuations by HF's no-cache forward over the whole sequence at every step.
    (HF ``generate`` on a long-RoPE Phi-3 does not always pick its own forward's argmax even
    at the first token — seen at a 37-token prompt — so its forward is the reference.)"""

    def continuation(self, prompt_ids: tuple[int, ...], n: int) -> tuple[int, ...]:
        ids = list(prompt_ids)
        with torch.no_grad():
            for _ in range(n):
                ids.append(int(self.hf(torch.tensor([ids])).logits[0, -1].argmax()))
        return tuple(ids[len(prompt_ids):])


@pytest.mark.parametrize("name", ["qwen3", "phi4_long"])
def test_greedy_invariant_to_batching_cache_page_size_and_chunking(dirs, hf, name):
    """The phi4_long prompts are past ORIG already, where HF uses the long factors too."""
    from transformers import AutoTokenizer

    oracle = ForwardOracle(hf[name], AutoTokenizer.from_pretrained(dirs[name]))
    seqs = prompts(name, 4)
    check_invariance(str(dirs[name]), oracle, seqs,
                     [list(oracle.continuation(tuple(s), N_NEW)) for s in seqs])


def check_invariance(path: str, oracle, seqs, ref, n_new: int = N_NEW):
    """Greedy outputs of ``seqs`` equal ``ref`` (the oracle's, ties aside) alone, batched cold
    and warm at page sizes 1 and 16, and with 8-token prefill chunks; returns the check."""
    params = SamplingParams(max_tokens=n_new, temperature=0, ignore_eos=True)

    def check(outs, label):
        for s, o, r in zip(seqs, outs, ref):
            oracle.assert_same(s, o.token_ids, r, label)

    for page_size in (1, 16):
        eng = Engine(path, page_size=page_size, kv_budget_mb=32)
        check([eng.generate(s, params) for s in seqs], f"alone ps={page_size}")
        eng.flush_cache()
        check(eng.generate(seqs, params), f"batch-cold ps={page_size}")
        warm = eng.generate(seqs, params)
        check(warm, f"batch-warm ps={page_size}")
        assert sum(o.meta["cached_tokens"] for o in warm) > 0
    chunked = Engine(path, page_size=16, kv_budget_mb=32, max_batch_tokens=8)
    check(chunked.generate(seqs, params), "chunked max_batch_tokens=8")
    return check


def test_long_rope_output_does_not_depend_on_where_the_sequence_crosses_orig(dirs):
    """A generation that crosses ORIG gives the same tokens whether its prefix was cached,
    chunked or batched with longer sequences (the factor set is the context's, not the
    sequence's)."""
    seq = list(range(100, 100 + ORIG - 6))
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    eng = Engine(str(dirs["phi4_long"]), page_size=4, kv_budget_mb=32)
    alone = eng.generate(seq, params).token_ids
    longer = list(range(300, 300 + 2 * ORIG))
    assert eng.generate([longer, seq], params)[1].token_ids == alone     # batched, warm
    chunked = Engine(str(dirs["phi4_long"]), page_size=4, kv_budget_mb=32, max_batch_tokens=5)
    assert chunked.generate(seq, params).token_ids == alone


def test_gguf_contradictions_are_named(gguf_dirs, tmp_path):
    """A Qwen3 file without its q/k norms, a Phi-3 file whose rotary dims exceed the head or
    whose long-RoPE factors do not fit them: clear errors before any weight is decoded."""
    import gguf

    from agentlang.runtime.weights.gguf_file import GgufError

    fields = gguf_tokenizer_fields()
    qwen = hf_to_gguf(gguf_dirs["qwen3"], tmp_path / "q.gguf", fields)
    phi = hf_to_gguf(gguf_dirs["phi4_long"], tmp_path / "p.gguf", fields)

    def rewrite(src, out, drop=(), meta=None, tensors=None):
        """A copy of ``src`` without tensors ``drop``, with metadata / 1-D tensors replaced."""
        r = gguf.GGUFReader(str(src))
        w = gguf.GGUFWriter(str(out), r.fields["general.architecture"].contents())
        for f in r.fields.values():
            if f.name.startswith("GGUF.") or f.name == "general.architecture":
                continue
            value = (meta or {}).get(f.name, f.contents())
            w.add_key_value(f.name, value, f.types[0], f.types[-1] if len(f.types) > 1 else None)
        for t in r.tensors:
            if t.name not in drop:
                data = (tensors or {}).get(t.name, t.data)
                w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return out

    with pytest.raises(GgufError, match="blk.0.attn_q_norm.weight missing"):
        load_gguf_model(rewrite(qwen, tmp_path / "q1.gguf", drop={"blk.0.attn_q_norm.weight"}))
    with pytest.raises(ModelLoadError, match="partial_rotary_factor 1.5 gives 24 rotary dims"):
        load_gguf_model(rewrite(phi, tmp_path / "p1.gguf", meta={"phi3.rope.dimension_count": 24}))
    with pytest.raises(ModelLoadError, match="long_factor: 4 values; the rotary dims \\(12\\) need 6"):
        load_gguf_model(rewrite(phi, tmp_path / "p2.gguf", tensors={
            "rope_factors_long.weight": np.ones(4, np.float32)}))
