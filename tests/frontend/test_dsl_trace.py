"""The tracer's dependency graph: nodes, edges, fork/join structure, placeholders, errors,
DOT/Mermaid output, pictures and the ``agentlang graph`` command."""

import re
import textwrap

import pytest

import agentlang as al
from agentlang.cli import main as cli_main


@al.function
def sot(s, question):
    s += al.system("Answer in steps.")
    s += al.user(question)
    s += al.assistant_begin() + "Skeleton: " + al.gen("skeleton", max_tokens=16) + "\n"
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += "Point: " + s["skeleton"] + " #" + str(i) + al.gen("point", max_tokens=8)
    forks.join()
    s += "Verdict: " + al.select("verdict", ["good", "bad"]) + al.assistant_end()


def kinds(graph, stream):
    return [n.kind for n in graph.stream_nodes(stream)]


def test_nodes_and_sequence_edges_of_main_stream():
    g = sot.trace()
    assert kinds(g, 0) == ["role_begin", "text", "role_end", "role_begin", "text", "role_end",
                           "role_begin", "text", "gen", "text", "fork", "join", "text",
                           "select", "role_end"]
    main = g.stream_nodes(0)
    for a, b in zip(main, main[1:]):
        assert a.id in g.predecessors(b.id, "seq")
    assert g.nodes_of("gen")[0].writes == "skeleton"
    assert [n.label for n in g.nodes_of("argument")] == ["question"]


def test_fork_join_structure():
    g = sot.trace()
    (fork,), (join,) = g.nodes_of("fork"), g.nodes_of("join")
    children = g.successors(fork.id, "fork")
    assert len(children) == 3
    child_streams = {g.node(c).stream for c in children}
    assert child_streams == {1, 2, 3} and all(g.stream_parent[c] == 0 for c in child_streams)
    for stream in child_streams:
        assert kinds(g, stream) == ["text", "gen"]
        last = g.stream_nodes(stream)[-1]
        assert join.id in g.successors(last.id, "join")
    assert len(g.predecessors(join.id, "join")) == 3
    assert fork.id in g.predecessors(join.id, "seq")


def test_data_edges_from_writers_and_arguments():
    g = sot.trace()
    question_arg = g.nodes_of("argument")[0]
    (user_text,) = g.successors(question_arg.id, "data")
    assert g.node(user_text).label == "{question}"
    skeleton = g.nodes_of("gen")[0]
    readers = g.successors(skeleton.id, "data")
    assert len(readers) == 3 and all(g.node(r).reads == ("skeleton",) for r in readers)
    assert all(g.node(r).stream in (1, 2, 3) for r in readers)


def test_gathered_variables_are_written_by_the_join():
    @al.function
    def prog(s):
        forks = s.fork(2)
        forks += al.gen("x")
        forks.join()
        s += "Best: " + s["x"]

    g = prog.trace()
    (join,) = g.nodes_of("join")
    (reader,) = g.successors(join.id, "data")
    assert g.node(reader).reads == ("x",)


def test_prefixes_found_by_tracing():
    g = sot.trace()
    assert g.constant_prefix.endswith("<|im_start|>user\n")   # stops at the argument
    assert g.prompt_prefix.endswith("Skeleton: ")              # stops at the first gen
    assert "{question}" in g.prompt_prefix
    concrete = sot.trace(question="Why?")
    assert "Why?" in concrete.prompt_prefix and concrete.nodes_of("argument") == []


def test_argument_in_fstring_raises_helpful_error():
    @al.function
    def bad(s, question):
        s += f"Q: {question}"

    with pytest.raises(al.TraceError) as e:
        bad.trace()
    msg = str(e.value)
    assert "argument 'question'" in msg and "f-string" in msg
    assert 's += "..." + question + "..."' in msg
    assert "Q: hi" in bad.trace(question="hi").prompt_prefix   # concrete value: fine


@pytest.mark.parametrize("body, what", [
    (lambda s, q: s.__iadd__(str(q)), "str()"),
    (lambda s, q: s.__iadd__("x" if q else "y"), "a condition"),
    (lambda s, q: s.__iadd__(q.upper()), "an attribute access (.upper)"),
    (lambda s, q: s.__iadd__("".join(list(q))), "a loop"),
])
def test_other_argument_misuses(body, what):
    prog = al.function(lambda s, q: body(s, q))
    with pytest.raises(al.TraceError, match=re.escape(f"argument 'q' was used in {what}")):
        prog.trace()


def test_branching_on_generated_value_and_partial_traces():
    @al.function
    def react(s):
        s += "Action: " + al.select("action", ["search", "finish"])
        if s["action"] == "search":
            s += al.gen("query")

    with pytest.raises(al.TraceError, match="generated variable 'action'.*comparison"):
        react.trace()
    g = react.trace(strict=False)
    assert "action" in g.truncated and [n.kind for n in g.nodes] == ["text", "select"]


def test_trace_calls_no_model_and_inlines_called_programs():
    @al.function
    def helper(s, x):
        s += "H(" + x + ")" + al.gen("h")

    @al.function
    def outer(s, y):
        s += helper(x=y)
        s += "!"

    m = al.Mock()
    g = outer.trace(backend=m)
    assert m.calls == []
    assert [n.kind for n in g.nodes if n.stream == 0] == ["text", "gen", "text"]
    assert g.nodes_of("argument")[0].label == "y"


def test_to_dot_and_to_mermaid():
    g = sot.trace()
    dot = g.to_dot()
    assert dot.startswith('digraph "sot" {') and dot.rstrip().endswith("}")
    assert dot.count("subgraph cluster_") == 4
    assert dot.count("->") == len(g.edges)
    assert 'label="gen skeleton"' in dot and "penwidth=2" in dot
    mm = g.to_mermaid()
    assert mm.startswith("flowchart TD")
    assert mm.count("==>") == len(g.edges_of("fork")) + len(g.edges_of("join"))
    assert mm.count("-.->") == len(g.edges_of("data"))
    assert 'n0["#lt;system#gt;"]' in mm
    assert mm.count("subgraph") == 4 and mm.count("\n  end") == 4


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_draw_png_and_svg(tmp_path, suffix, magic):
    out = tmp_path / ("graph" + suffix)
    sot.trace().draw(out)
    data = out.read_bytes()
    assert data.startswith(magic) and len(data) > 2000
    if suffix == ".svg":
        assert b"gen skeleton" in data or b"skeleton" in data


def test_draw_rejects_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="must end with one of"):
        sot.trace().draw(tmp_path / "g.jpg")


def test_cli_graph(tmp_path, monkeypatch, capsys):
    mod = tmp_path / "myprog.py"
    mod.write_text(textwrap.dedent("""
        import agentlang as al

        @al.function
        def pipeline(s, topic):
            s += "Topic: " + topic + "\\n"
            forks = s.fork(2)
            forks += al.gen("idea", max_tokens=8)
            forks.join()
            s += al.select("pick", ["a", "b"])

        not_a_program = 3
    """))
    monkeypatch.chdir(tmp_path)
    assert cli_main(["graph", "myprog:pipeline", "-o", "g.png"]) == 0
    assert (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG")
    assert cli_main(["graph", f"{mod}:pipeline", "-o", "g.svg"]) == 0
    assert b"<svg" in (tmp_path / "g.svg").read_bytes()
    assert cli_main(["graph", "myprog:pipeline", "-o", "g.mmd", "--arg", "topic=cats"]) == 0
    assert "Topic: cats" in (tmp_path / "g.mmd").read_text()
    assert cli_main(["graph", "myprog:pipeline", "-o", "g.dot"]) == 0
    assert (tmp_path / "g.dot").read_text().startswith("digraph")
    assert "wrote g.dot" in capsys.readouterr().out
    assert cli_main(["graph", "myprog:not_a_program", "-o", "x.png"]) == 2
    assert "not an @agentlang.function" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["nonsense"])
