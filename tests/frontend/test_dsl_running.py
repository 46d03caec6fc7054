"""Streaming (text_iter), arun, and run_batch (ordering, prefix caching, progress bar)."""

import asyncio
import threading
import time

import pytest

import agentlang as al

LONG_SYSTEM = "You are a meticulous assistant who answers questions about geography. " * 2


@al.function
def qa(s, question):
    s += al.system(LONG_SYSTEM)
    s += al.user(question)
    s += al.assistant(al.gen("answer", max_tokens=24))


def test_text_iter_streams_chunks_while_generating():
    m = al.Mock({"assistant\n": "Paris is the capital of France."}, chunk_size=4, delay_s=0.02)
    st = qa.run(question="Capital of France?", backend=m, stream=True)
    chunks = list(st.text_iter())
    assert len(chunks) > 5
    assert "".join(chunks) == st.text()
    assert st["answer"] == "Paris is the capital of Fra"[:24]


def test_text_iter_of_one_variable():
    m = al.Mock({"assistant\n": "Paris is the capital."}, chunk_size=5, delay_s=0.01)
    st = qa.run(question="Capital?", backend=m, stream=True)
    chunks = list(st.text_iter("answer"))
    assert chunks == ["Paris", " is t", "he ca", "pital", "."]
    assert list(st.text_iter(name="answer")) == chunks   # the spelling
    assert [c.kind for c in m.calls] == ["stream"]


def test_text_iter_arrives_before_the_program_ends():
    gate = threading.Event()

    def reply(prompt):
        return "x" * 20

    @al.function
    def slow(s):
        s += al.gen("a", max_tokens=20)
        gate.wait(5)
        s += "tail"

    st = slow.run(backend=al.Mock(reply, chunk_size=5), stream=True)
    it = st.text_iter()
    first = next(it)           # arrives while the body is blocked on the gate
    assert first and not gate.is_set()
    gate.set()
    assert (first + "".join(it)).endswith("tail")


def test_text_iter_without_stream_yields_everything_once():
    st = qa.run(question="q", backend=al.Mock())
    assert list(st.text_iter()) == [st.text()]
    assert list(st.text_iter("answer")) == [st["answer"]]


def test_stream_errors_reach_the_reader():
    @al.function
    def bad(s):
        s += al.gen("a", max_tokens=3)
        raise RuntimeError("boom in body")

    st = bad.run(backend=al.Mock(), stream=True)
    with pytest.raises(RuntimeError, match="boom in body"):
        list(st.text_iter())


def test_text_async_iter():
    async def main():
        m = al.Mock({"assistant\n": "abcdefgh"}, chunk_size=3)
        st = qa.run(question="q", backend=m, stream=True)
        return [c async for c in st.text_async_iter("answer")]

    assert asyncio.run(main()) == ["abc", "def", "gh"]


def test_arun_runs_programs_concurrently():
    m = al.Mock(lambda p: p.split("user\n")[-1].split("<")[0].upper(), delay_s=0.2)

    async def main():
        return await asyncio.gather(*(qa.arun(question=f"q{i}", backend=m) for i in range(8)))

    t0 = time.perf_counter()
    states = asyncio.run(main())
    elapsed = time.perf_counter() - t0
    assert [st["answer"] for st in states] == [f"Q{i}" for i in range(8)]
    assert m.max_concurrent == 8 and elapsed < 1.0   # sequential: >= 1.6 s


def test_arun_propagates_errors():
    async def main():
        await qa.arun(backend=al.Mock())

    with pytest.raises(ValueError, match="missing arguments"):
        asyncio.run(main())


def test_run_batch_results_in_input_order_with_progress_bar(capsys):
    m = al.Mock(lambda p: "ans:" + p.split("user\n")[-1].split("<")[0])
    questions = [{"question": f"question {i}"} for i in range(16)]
    states = qa.run_batch(questions, backend=m, progress_bar=True, temperature=0)
    assert [st["answer"] for st in states] == [f"ans:question {i}"[:24] for i in range(16)]
    assert "16/16" in capsys.readouterr().err
    assert all(c.options.temperature == 0 for c in m.calls if c.kind == "generate")


def test_run_batch_caches_shared_prefix_first_and_orders_by_prefix():
    @al.function
    def fewshot(s, style, question):
        s += style + "\n" + "Example: Q: 1+1 A: 2. Example: Q: 2+2 A: 4. " * 2
        s += "Q: " + question + " A:" + al.gen("a", max_tokens=3)

    m = al.Mock()
    batch = [{"style": "STYLE-B", "question": "x1"}, {"style": "STYLE-A", "question": "x2"},
             {"style": "STYLE-B", "question": "x3"}, {"style": "STYLE-A", "question": "x4"}]
    states = fewshot.run_batch(batch, backend=m, num_threads=1)
    assert [st.text().split("Q: ")[-1][:2] for st in states] == ["x1", "x2", "x3", "x4"]
    cached = [t for kind, _, t in m.prefix_events if kind == "cache"]
    assert len(cached) == 2
    assert cached[0].startswith("STYLE-A\nExample") and cached[1].startswith("STYLE-B\nExample")
    assert m.locked == {}   # released after the batch
    # with one thread, the run order is the sorted order: both STYLE-A programs first
    order = [c.prompt.split("\n")[0] for c in m.calls if c.kind == "generate"]
    assert order == ["STYLE-A", "STYLE-A", "STYLE-B", "STYLE-B"]


def test_run_batch_does_not_cache_short_or_unshared_prefixes():
    @al.function
    def short(s, q):
        s += q + al.gen("a", max_tokens=2)

    m = al.Mock()
    short.run_batch([{"q": "a"}, {"q": "b"}], backend=m)
    assert m.prefix_events == []


def test_run_batch_raises_first_error_after_all_finish():
    @al.function
    def maybe_fail(s, i):
        s += al.gen("a", max_tokens=2)
        if i == 2 and s["a"] is not None:
            raise KeyError("item 2 failed")

    m = al.Mock()
    with pytest.raises(KeyError, match="item 2 failed"):
        maybe_fail.run_batch([{"i": i} for i in range(4)], backend=m)
    assert len([c for c in m.calls if c.kind == "generate"]) == 4


def test_run_batch_bad_input():
    with pytest.raises(ValueError, match="unknown options"):
        qa.run_batch([{"question": "q"}], backend=al.Mock(), question="q")
    with pytest.raises(ValueError, match="num_threads"):
        qa.run_batch([{"question": "q"}], backend=al.Mock(), num_threads=0)
    with pytest.raises(ValueError, match="has no argument 'qq'"):
        qa.run_batch([{"qq": "q"}], backend=al.Mock())
    assert qa.run_batch([], backend=al.Mock()) == []
