"""Bad input raises a clear error at the point of the mistake."""

import pytest

import agentlang as al


def run(body):
    return al.function(body).run(backend=al.Mock())


def test_gen_name_written_twice_in_one_expression():
    with pytest.raises(ValueError, match="'x' is written twice in one expression"):
        al.gen("x") + " and " + al.gen("x")
    with pytest.raises(ValueError, match="'c' is written twice"):
        al.select("c", ["a", "b"]) + al.gen("c")


def test_gen_name_reused_inside_var_scope_of_that_name():
    def body(s):
        with s.var_scope("summary"):
            s += al.gen("summary")

    with pytest.raises(ValueError, match="writes variable 'summary' inside var_scope"):
        run(body)


def test_gen_name_may_be_reassigned_by_later_statements():
    def body(s):
        for _ in range(3):
            s += al.gen("step", max_tokens=2) + "\n"

    assert isinstance(run(body)["step"], str)


def test_select_without_choices():
    with pytest.raises(ValueError, match="needs a non-empty list of choices"):
        al.select("c", [])
    with pytest.raises(ValueError, match="needs a non-empty list of choices"):
        al.select("c")
    with pytest.raises(ValueError, match="duplicates"):
        al.select("c", ["a", "a"])
    with pytest.raises(ValueError, match="non-empty strings"):
        al.select("c", ["a", ""])


def test_joining_twice():
    def body(s):
        forks = s.fork(2)
        forks.join()
        forks.join()

    with pytest.raises(ValueError, match="already joined; join\\(\\) may be called once"):
        run(body)


def test_unknown_backend_options():
    with pytest.raises(ValueError, match=r"unknown Runtime option\(s\) \['kv_budget'\]; accepted"):
        al.Runtime(kv_budget=64)          # raised before any model is loaded
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        al.Mock(bogus=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        al.RuntimeEndpoint("http://localhost:1", bogus=1)
    with pytest.raises(ValueError, match="api must be"):
        al.OpenAI("m", api="responses")
    with pytest.raises(ValueError, match="has no argument 'max_token'.*sampling options"):
        al.function(lambda s: None).run(backend=al.Mock(), max_token=3)


def test_tool_with_unschemable_hints():
    with pytest.raises(ValueError, match="tool f, parameter 'cb'.*cannot form a JSON schema"):
        @al.tool
        def f(cb: object) -> None: ...


def test_argument_in_fstring_during_tracing():
    @al.function
    def prog(s, name):
        s += f"Hello {name}"

    with pytest.raises(al.TraceError, match="argument 'name' was used in an f-string"):
        prog.trace()


def test_role_mistakes():
    with pytest.raises(ValueError, match="roles do not nest"):
        run(lambda s: s.__iadd__(al.user_begin() + al.assistant_begin()))
    with pytest.raises(ValueError, match="role 'user' ends but the open role is None"):
        run(lambda s: s.__iadd__(al.user_end()))
    with pytest.raises(ValueError, match="var_scope\\('v'\\) ends but was never opened"):
        run(lambda s: s.__iadd__(al.ir.VarScopeEnd("v")))


def test_bad_values_appended():
    with pytest.raises(ValueError, match="cannot append None"):
        run(lambda s: s.__iadd__(None))
    with pytest.raises(TypeError, match="cannot append a dict.*json.dumps"):
        run(lambda s: s.__iadd__({"a": 1}))


@pytest.mark.parametrize("kwargs, match", [
    ({"max_tokens": 0}, "max_tokens: must be an integer >= 1, got 0"),
    ({"temperature": -1}, "temperature: must be a number >= 0, got -1"),
    ({"top_p": 0}, r"top_p: must be in \(0, 1\], got 0"),
    ({"regex": "(", "name": "r"}, "does not compile"),
    ({"regex": "a", "json_schema": {"type": "string"}}, "at most one of"),
    ({"dtype": list}, "dtype must be one of"),
    ({"json_schema": 3}, "json_schema must be a dict"),
    ({"name": ""}, "gen name must be a non-empty str"),
    ({"stop": [""]}, "stop must be a non-empty str"),
])
def test_bad_gen_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        al.gen(**kwargs)


def test_program_definition_mistakes():
    with pytest.raises(ValueError, match="first parameter must be the state"):
        al.function(lambda: None)
    with pytest.raises(ValueError, match="takes 1 arguments"):
        al.function(lambda s, a: None).run(1, 2, backend=al.Mock())
