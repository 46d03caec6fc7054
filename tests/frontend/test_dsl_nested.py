"""SGLang's frontend semantics for programs called inside a running program: used as a value
the call is its own run (SGLang's ``SglFunction.__call__`` returns a ``ProgramState``), while
``s += other(...)`` and ``other(s, ...)`` compose into ``s``; ``s.fork(n, position_ids_offset)``
is accepted."""

import pytest

import agentlang as al


@al.function
def expand(s, topic):
    s += f"Write about {topic}: "
    s += al.gen("paragraph", max_tokens=32)


def mock():
    return al.Mock({"Write about": "a paragraph."})


def test_a_call_used_as_a_value_is_its_own_run():
    @al.function
    def outline(s, topics):
        s += "Outline.\n"
        paragraphs = [expand(topic=t) for t in topics]
        s += "Paragraphs: " + " | ".join(p["paragraph"] for p in paragraphs)

    m = mock()
    st = outline.run(topics=["bees", "rivers"], backend=m)
    assert st.text() == "Outline.\nParagraphs: a paragraph. | a paragraph."
    assert "Write about" not in st.text()              # the nested runs have their own text
    assert [c.kind for c in m.calls].count("generate") == 2


def test_nested_state_methods_and_a_separate_run_id():
    seen = {}

    @al.function
    def outer(s):
        s += "Outer. "
        inner = expand(topic="glaciers")
        seen["text"] = inner.text()
        seen["state"] = inner.state()
        s += "done"

    st = outer.run(backend=mock())
    assert seen["text"] == "Write about glaciers: a paragraph."
    assert isinstance(seen["state"], al.ProgramState)
    assert st.text() == "Outer. done"


def test_composing_calls_stay_inline():
    @al.function
    def plus_equals(s):
        s += "A. "
        s += expand(topic="owls")

    @al.function
    def with_state(s):
        s += "B. "
        expand(s, topic="owls")

    for prog, head in ((plus_equals, "A. "), (with_state, "B. ")):
        st = prog.run(backend=mock())
        assert st.text() == head + "Write about owls: a paragraph."
        assert st["paragraph"] == "a paragraph."


def test_composed_calls_never_run_twice():
    m = mock()

    @al.function
    def once(s):
        call = expand(topic="x")
        s += call

    once.run(backend=m)
    assert [c.kind for c in m.calls].count("generate") == 1


def test_fork_takes_sglangs_position_ids_offset():
    @al.function
    def forks(s):
        s += "Root. "
        f = s.fork(2, position_ids_offset=[0, 0])
        f += al.gen("x", max_tokens=4)
        f.join()

    forks.run(backend=al.Mock({"Root.": "ok"}))
    for bad in ([0], [0, -1], "0,0", [0.5, 0]):
        @al.function
        def bad_fork(s, bad=bad):
            s += "Root. "
            s.fork(2, position_ids_offset=bad)

        with pytest.raises(ValueError, match="position_ids_offset"):
            bad_fork.run(backend=al.Mock({}))
