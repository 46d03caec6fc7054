"""Gemma's sliding layers keep KV for the window only (``cache/window_pages.py``), and greedy
output does not change with it: the same tokens as HF's forward whether the window pages are
plentiful, so few that finished requests' windows are evicted (radix hits cut back to where a
window is resident), or so few that running requests run out of them (eviction, preemption);
through forks, chunked prefill and prefix hits longer than the window."""

import pytest
from transformers import AutoTokenizer

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.cache.radix_cache import TokenKey
from tests.models.test_families import ForwardOracle
from tests.models.test_gemma import FAMILIES, N_NEW, WINDOW, prompts
from tests.support.models import family_dirs, hf_models

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(max_tokens=N_NEW, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    dirs = family_dirs(tmp_path_factory, {"gemma3": FAMILIES["gemma3"]})
    hf = hf_models(dirs, attn_implementation="eager")["gemma3"]
    return str(dirs["gemma3"]), ForwardOracle(hf, AutoTokenizer.from_pretrained(dirs["gemma3"]))


def check(oracle, seqs, outs, label):
    for s, o in zip(seqs, outs):
        oracle.assert_same(s, o.token_ids, list(oracle.continuation(tuple(s), N_NEW)), label)


def drained(eng: Engine) -> None:
    """Nothing runs: after a flush every global and window page is free."""
    eng.flush_cache()
    m = eng.metrics()
    assert eng.allocator.num_free == eng.allocator.num_pages
    assert m["window_pages_free"] == m["window_pages_total"] and m["window_pages_pinned"] == 0
    eng.pool.windows.check_integrity()


def test_roomy_window_pages_keep_hits_longer_than_the_window(gemma3):
    path, oracle = gemma3
    eng = Engine(path, page_size=4, num_pages=256, max_batch_tokens=64, window_kv_fraction=0.5)
    assert eng.pool.windows.num_window_pages == 128
    shared = prompts(1, 40)[0]
    seqs = [shared + [7 + i, 300 + i, 90 + 2 * i] for i in range(4)]
    first = eng.generate(seqs[0], PARAMS)
    rest = eng.generate(seqs[1:], PARAMS)
    check(oracle, seqs, [first, *rest], "shared prefix longer than the window")
    assert [o.meta["cached_tokens"] for o in rest] == [40] * 3          # > WINDOW: kept
    assert 40 > WINDOW
    forked = eng.generate(seqs[0], SamplingParams(max_tokens=N_NEW, temperature=0,
                                                  ignore_eos=True, n=3))
    check(oracle, [seqs[0]] * 3, forked.outputs, "forks n=3")
    drained(eng)


def test_scarce_window_pages_cut_hits_and_never_change_output(gemma3):
    path, oracle = gemma3
    seqs = prompts(4)
    eng = Engine(path, page_size=4, num_pages=256, max_batch_tokens=32,
                 window_kv_fraction=0.01)
    wp = eng.pool.windows.num_window_pages
    assert wp < 16, wp                                       # the floor: one request's window + a step
    check(oracle, seqs, eng.generate(seqs, PARAMS), "cold, scarce window pages")
    for s in prompts(6, 2 * WINDOW):                         # churn: finished windows go idle
        eng.generate([t + 1 for t in s], PARAMS)
    m = eng.metrics()
    assert m["window_evictions"] > 0
    ns = eng.builder.namespace(None)
    tree = [eng.cache.match_prefix(TokenKey.check(s, "test"), ns, record=False).length
            for s in seqs]                               # what the radix tree still holds
    warm = eng.generate(seqs, PARAMS)
    check(oracle, seqs, warm, "warm after window evictions")
    used = [o.meta["cached_tokens"] for o in warm]
    assert all(u <= t for u, t in zip(used, tree))
    assert any(u < t for u, t in zip(used, tree)), (used, tree)   # some hit was cut back
    drained(eng)
    # chunks of 8 tokens through the same scarce pool
    chunked = Engine(path, page_size=4, num_pages=256, max_batch_tokens=8,
                     window_kv_fraction=0.01)
    check(oracle, seqs, chunked.generate(seqs, PARAMS), "chunked, scarce window pages")
    drained(chunked)


def test_running_out_of_window_pages_holds_admissions_back_and_output_holds(gemma3):
    """Six requests in decode would pin 3 window pages each, more than the 12 there are:
    admissions wait for window pages (the radix tree is not evicted for them)."""
    path, oracle = gemma3
    seqs = prompts(6)
    eng = Engine(path, page_size=4, num_pages=256, max_batch_tokens=32, window_kv_fraction=0.01)
    outs = eng.generate(seqs, PARAMS)
    check(oracle, seqs, outs, "window pages exhausted")
    m = eng.metrics()
    assert m["window_evictions"] > 0 and m["evictions"] == 0   # the radix tree was not wiped
    assert eng.cache.cached_pages >= sum(len(s) for s in seqs) // 4
    drained(eng)
    # few global pages too: running requests are preempted, their windows released with them
    tight = Engine(path, page_size=4, num_pages=24, max_batch_tokens=8, window_kv_fraction=0.01)
    assert tight.pool.windows.num_window_pages == 6
    check(oracle, seqs, tight.generate(seqs, PARAMS), "preempted, scarce window pages")
    assert tight.metrics()["preemptions"] > 0
    drained(tight)


def test_native_decode_layer_reads_and_writes_the_window_pages(tmp_path_factory, tmp_path):
    """A Q8_0 Gemma 3 file decodes in the C layer (sliding layers through their own pages):
    the same tokens with window pages so scarce that windows are evicted as with one a page."""
    from agentlang.runtime.quant.native import qmatmul_library
    from tests.support.gguf_convert import hf_to_gguf
    from tests.support.gguf_files import gguf_tokenizer_fields

    if qmatmul_library() is None:
        pytest.skip("no native library on this machine")
    fields = gguf_tokenizer_fields()
    d = family_dirs(tmp_path_factory, {"gemma3": FAMILIES["gemma3"]}, "g_", seed=3,
                    query_pre_attn_scalar=16, vocab_size=len(fields["tokenizer.ggml.tokens"]))
    path = str(hf_to_gguf(d["gemma3"], tmp_path / "q8.gguf", fields, "Q8_0"))
    seqs = [[(5 * i + j) % 200 + 3 for j in range(3 * WINDOW + 2 * i)] for i in range(4)]
    runs = {}
    for label, frac in (("one a page", 1.0), ("scarce", 0.01)):
        eng = Engine(path, weights="auto", page_size=4, num_pages=256, max_batch_tokens=32,
                     window_kv_fraction=frac)
        assert eng.model.native_decoder is not None
        runs[label] = [[o.token_ids for o in eng.generate(seqs, PARAMS)] for _ in range(2)]
        if label == "scarce":
            assert eng.metrics()["window_evictions"] > 0
        drained(eng)
    assert runs["scarce"] == runs["one a page"]
    assert runs["scarce"][0] == runs["scarce"][1]          # warm equals cold


def test_native_decode_alone_past_512_keys_matches_batched(tmp_path_factory, tmp_path):
    """Past 512 keys a sequence decoding alone attends in phases (the C layer's few-task cut,
    sliding layers' windows included); batched with three others it does not. The same greedy
    tokens either way, at one thread or two."""
    import torch

    from agentlang.runtime.quant.native import qmatmul_library
    from tests.support.gguf_convert import hf_to_gguf
    from tests.support.gguf_files import gguf_tokenizer_fields

    if qmatmul_library() is None:
        pytest.skip("no native library on this machine")
    fields = gguf_tokenizer_fields()
    d = family_dirs(tmp_path_factory, {"gemma3": FAMILIES["gemma3"]}, "long_", seed=5,
                    query_pre_attn_scalar=16, max_position_embeddings=1024,
                    vocab_size=len(fields["tokenizer.ggml.tokens"]))
    path = str(hf_to_gguf(d["gemma3"], tmp_path / "q8.gguf", fields, "Q8_0"))
    seqs = [[(5 * i + j) % 200 + 3 for j in range(520 + 9 * i)] for i in range(4)]
    eng = Engine(path, weights="auto", page_size=4, num_pages=700, max_batch_tokens=256)
    assert eng.model.native_decoder is not None
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            batched = [o.token_ids for o in eng.generate(seqs, PARAMS)]
            eng.flush_cache()
            alone = [eng.generate(s, PARAMS).token_ids for s in seqs]
            eng.flush_cache()
            assert alone == batched, n
    finally:
        torch.set_num_threads(threads)
    drained(eng)
