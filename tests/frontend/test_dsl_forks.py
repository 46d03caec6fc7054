"""fork/join on the Mock backend: semantics, prefix commit/release, concurrency, errors."""

import threading
import time

import pytest

import agentlang as al


@al.function
def tips(s, topic, n=3):
    s += "Tips about " + topic + ":\n"
    forks = s.fork(n)
    for i, f in enumerate(forks):
        f += f"{i + 1}. " + al.gen("tip", max_tokens=12, stop="\n")
    forks.join()
    s += "Done."


def test_fork_join_gathers_variables_in_fork_order():
    replies = {"1. ": "first tip", "2. ": "second tip", "3. ": "third tip"}
    st = tips.run(topic="cats", backend=al.Mock(replies))
    assert st["tip"] == ["first tip", "second tip", "third tip"]
    assert st.text() == "Tips about cats:\nDone."   # gather mode leaves the parent text alone
    assert len(st.get_meta_info("tip")) == 3


def test_fork_commits_prefix_once_and_releases_at_join():
    m = al.Mock()
    tips.run(topic="dogs", backend=m)
    assert m.prefix_events == [("cache", 1, "Tips about dogs:\n"),
                               ("release", 1, "Tips about dogs:\n")]
    assert m.locked == {}
    # every branch prompt extends the committed prefix
    prompts = [c.prompt for c in m.calls if c.kind == "generate"]
    assert len(prompts) == 3 and all(p.startswith("Tips about dogs:\n") for p in prompts)


def test_prefix_is_locked_while_branches_run():
    m = al.Mock()
    locked_during = []

    def reply(prompt):
        locked_during.append(dict(m.locked))
        return "x"

    m.replies = reply
    tips.run(topic="t", backend=m)
    assert all(list(d.values()) == ["Tips about t:\n"] for d in locked_during)


def test_branches_generate_concurrently():
    m = al.Mock(delay_s=0.2)
    t0 = time.perf_counter()
    tips.run(topic="x", n=4, backend=m)
    elapsed = time.perf_counter() - t0
    assert m.max_concurrent == 4
    assert elapsed < 0.6   # sequential would take >= 0.8 s


def test_concat_join_appends_fork_text_in_order():
    @al.function
    def prog(s):
        s += "Start\n"
        forks = s.fork(2)
        forks[0] += "A" + al.gen("x", max_tokens=2)
        forks[1] += "B" + al.gen("x", max_tokens=2)
        forks.join(mode="concate_and_append")
        s += "|end"

    st = prog.run(backend=al.Mock({"A": "aa", "B": "bb"}))
    assert st.text() == "Start\nAaaBbb|end"


def test_fork_broadcast_list_and_lambda():
    @al.function
    def prog(s):
        forks = s.fork(3)
        forks += "common "
        forks += ["a", "b", "c"]
        forks += lambda i: str(i)
        forks.join("concate_and_append")

    st = prog.run(backend=al.Mock())
    assert st.text() == "common a0common b1common c2"


def test_fork_inside_role_and_reading_forks_after_join():
    @al.function
    def prog(s):
        s += al.user("Question?")
        s += al.assistant_begin()
        forks = s.fork(2)
        forks += al.gen("draft", max_tokens=3)
        forks.join()
        s += "final" + al.assistant_end()
        s["first"] = forks[0]["draft"]

    st = prog.run(backend=al.Mock({"assistant\n": "abc"}))
    assert st["draft"] == ["abc", "abc"] and st["first"] == "abc"
    assert st.messages()[-1] == {"role": "assistant", "content": "final"}


def test_nested_forks_and_unjoined_fork_released_at_end():
    @al.function
    def prog(s):
        s += "root "
        outer = s.fork(2)
        outer += "lvl1 "
        inner = outer[0].fork(2)
        inner += al.gen("leaf", max_tokens=2)
        inner.join()
        outer.join()
        dangling = s.fork(2)
        dangling += al.gen("z", max_tokens=1)

    m = al.Mock()
    st = prog.run(backend=m)
    assert len(st["leaf"]) == 2 and len(st["leaf"][0]) == 2 and st["leaf"][1] is None
    cached = [e for e in m.prefix_events if e[0] == "cache"]
    released = [e for e in m.prefix_events if e[0] == "release"]
    assert len(cached) == 3 and sorted(h for _, h, _ in cached) == sorted(
        h for _, h, _ in released)
    assert m.locked == {}


def test_fork_of_one_and_copy_do_not_commit_prefixes():
    @al.function
    def prog(s):
        s += "text "
        with s.copy() as c:
            c += al.gen("x", max_tokens=2)
        s += "after"

    m = al.Mock({"text ": "ok"})
    st = prog.run(backend=m)
    assert st["x"] == ["ok"] and st.text() == "text after" and m.prefix_events == []


def test_empty_prefix_fork_commits_nothing():
    @al.function
    def prog(s):
        forks = s.fork(2)
        forks += al.gen("x", max_tokens=1)
        forks.join()

    m = al.Mock()
    prog.run(backend=m)
    assert m.prefix_events == []


def test_join_twice_and_append_after_join_are_errors():
    @al.function
    def twice(s):
        forks = s.fork(2)
        forks.join()
        forks.join()

    with pytest.raises(ValueError, match="already joined"):
        twice.run(backend=al.Mock())

    @al.function
    def after(s):
        forks = s.fork(2)
        forks.join()
        forks[0] += "late"

    with pytest.raises(ValueError, match="this fork was joined"):
        after.run(backend=al.Mock())

    @al.function
    def group_after(s):
        forks = s.fork(2)
        forks.join()
        forks += "late"

    with pytest.raises(ValueError, match="joined"):
        group_after.run(backend=al.Mock())


def test_bad_fork_arguments():
    @al.function
    def zero(s):
        s.fork(0)

    with pytest.raises(ValueError, match="fork size"):
        zero.run(backend=al.Mock())

    @al.function
    def badmode(s):
        s.fork(2).join("merge")

    with pytest.raises(ValueError, match="join mode"):
        badmode.run(backend=al.Mock())

    @al.function
    def badlist(s):
        forks = s.fork(2)
        forks += ["only one"]

    with pytest.raises(ValueError, match="needs 2 items"):
        badlist.run(backend=al.Mock())


def test_error_in_a_fork_is_raised_even_without_join():
    @al.function
    def unjoined(s):
        forks = s.fork(2)
        forks += al.gen("x", dtype=int)

    @al.function
    def joined(s):
        forks = s.fork(2)
        forks += al.gen("x", dtype=int)
        forks.join()
        s += "after"

    for prog in (unjoined, joined):
        m = al.Mock()
        m._typed = staticmethod(lambda *a: "abc")   # a backend returning a non-int
        with pytest.raises(ValueError, match="not a int"):
            prog.run(backend=m)
        assert m.locked == {}


def test_forks_of_a_frontier_commit_their_prefixes_together():
    """Forking each state of a frontier in a loop does not wait for one prefix commit per
    state: the commits reach the backend together (with a commit per state in turn, the
    barrier of 3 breaks)."""

    @al.function
    def frontier(s):
        s += "Root."
        nodes = s.fork(3)
        nodes += lambda i: f" node {i}"
        children = []
        for node in nodes:
            forks = node.fork(2)
            forks += al.gen("leaf", max_tokens=4)
            children.append(forks)
        for forks in children:
            forks.join()
        nodes.join()

    m = al.Mock()
    together = threading.Barrier(3, timeout=10)   # the three nodes' commits, at once

    def commit(text: str, inner=m.cache_prefix):
        if text != "Root.":                        # the root's own fork commits alone
            together.wait()
        return inner(text)

    m.cache_prefix = commit
    st = frontier.run(backend=m)
    assert st.error() is None
    cached = sorted(t for kind, _, t in m.prefix_events if kind == "cache")
    assert cached == ["Root.", "Root. node 0", "Root. node 1", "Root. node 2"]
    assert m.locked == {}
    leaves = [c.prompt for c in m.calls if c.kind == "generate"]
    assert sorted(p[:len("Root. node 0")] for p in leaves) == sorted(
        f"Root. node {i}" for i in range(3) for _ in range(2))


def test_a_parent_error_before_the_fork_point_reaches_its_forks():
    """The parent fails after ``fork`` returned but before its worker reached the fork point:
    the forks run nothing, reading them raises the parent's error, nothing stays locked."""

    @al.function
    def failing(s):
        s += al.gen("n", dtype=int)
        forks = s.fork(2)
        forks += al.gen("x", max_tokens=3)
        forks[0]["x"]

    m = al.Mock(delay_s=0.2)
    m._typed = staticmethod(lambda *a: "abc")
    with pytest.raises(ValueError, match="not a int"):
        failing.run(backend=m)
    assert [c for c in m.calls if c.kind == "generate" and c.options.max_tokens == 3] == []
    assert m.locked == {}
