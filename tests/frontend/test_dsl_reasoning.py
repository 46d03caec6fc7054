"""``al.separate_reasoning`` (SGLang's): a gen's reasoning block goes to
``<name>_reasoning_content``, the answer stays in ``<name>`` and in the state's text, so later
calls see the answer only. Scripted on the Mock backend, traced, and end to end on the runtime
(a regex makes the embedded model write a block)."""

import pytest

import agentlang as al

REPLY = "<think>\nThe capital of France is Paris.\n</think>\n\nParis"


@al.function
def ask(s, model_type="qwen3"):
    s += al.user("Capital of France?")
    s += al.assistant(al.separate_reasoning(al.gen("answer", max_tokens=80), model_type=model_type))
    s += al.user("And then?")
    s += al.assistant(al.gen("next", max_tokens=5))


def test_block_split_into_the_variable_and_out_of_the_text():
    backend = al.Mock({"Capital of France?": REPLY, "And then?": "Done"})
    state = ask.run(backend=backend)
    assert state["answer"] == "Paris"
    assert state["answer_reasoning_content"] == "The capital of France is Paris."
    assert "<think>" not in state.text() and "Paris" in state.text()
    # the next call's prompt has the answer only
    assert "<think>" not in backend.calls[-1].prompt and backend.calls[-1].prompt.count("Paris") == 1


def test_no_block_and_forced_block():
    state = ask.run(backend=al.Mock({"Capital of France?": "Paris"}))
    assert (state["answer"], state["answer_reasoning_content"]) == ("Paris", "")
    # DeepSeek-R1's template opens the block: the output starts inside it
    forced = ask.run(model_type="deepseek-r1",
                     backend=al.Mock({"Capital of France?": "Paris it is.</think>\n\nParis"}))
    assert (forced["answer"], forced["answer_reasoning_content"]) == ("Paris", "Paris it is.")


def test_bad_uses_are_named():
    with pytest.raises(ValueError, match="model_type 'llama': accepted qwen3"):
        al.separate_reasoning(al.gen("a"), model_type="llama")
    with pytest.raises(ValueError, match="needs a named gen or select"):
        al.separate_reasoning(al.gen(), model_type="qwen3")
    with pytest.raises(ValueError, match="written twice"):
        al.gen("a_reasoning_content") + al.separate_reasoning(al.gen("a"))


def test_traced_graph_has_the_split():
    graph = ask.trace()
    node = next(n for n in graph.nodes if n.kind == "separate_reasoning")
    assert node.writes == "answer_reasoning_content"


def test_run_batch_and_the_runtime_end_to_end():
    """The embedded model, constrained to write a block, then split: the second call's prompt
    on the engine is the answer only (its KV is the answer's, not the block's)."""
    states = ask.run_batch([{}, {"model_type": "qwen3"}], backend=al.Mock({"France": REPLY}))
    assert all(s["answer"] == "Paris" for s in states)

    @al.function
    def think(s):
        s += al.user("Name a colour.")
        s += al.assistant(al.separate_reasoning(al.gen(
            "c", max_tokens=40, regex=r"<think>\n[a-z ]{3,20}\n</think>\n\n[A-Z][a-z]{2,8}")))

    rt = al.Runtime(kv_budget_mb=64)
    try:
        state = think.run(backend=rt, temperature=0)
        assert state["c"] and state["c"][0].isupper() and "<" not in state["c"]
        assert 3 <= len(state["c_reasoning_content"]) <= 20
        assert "<think>" not in state.text() and state["c"] in state.text()
    finally:
        rt.close()
