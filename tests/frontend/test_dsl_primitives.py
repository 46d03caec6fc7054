"""agentlang primitives on the deterministic Mock backend: gen, typed gens, constraints,
select, roles, state accessors, run options, bind, program composition."""

import json
import re

import jsonschema
import pydantic
import pytest

import agentlang as al
from agentlang.chat_template import chatml

SYS = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def last_gen_options(mock):
    return [c.options for c in mock.calls if c.kind in ("generate", "stream")][-1]


def test_gen_named_and_unnamed_append_text():
    @al.function
    def prog(s):
        s += "A:" + al.gen("a", max_tokens=4) + "|" + al.gen(max_tokens=3)

    m = al.Mock({"A:": "hello world"})
    st = prog.run(backend=m)
    assert st["a"] == "hell"
    assert st.text().startswith("A:hell|")
    assert len(st.text()) == len("A:hell|") + 3   # the unnamed gen appended 3 chars
    assert "a" in st
    assert st.get_meta_info("a")["finish_reason"] == {"type": "length", "matched": None}


def test_gen_stop_and_finish_reason():
    @al.function
    def prog(s, question):
        s += "Q: " + question + "\nA:" + al.gen("answer", stop=["\n", "Q:"])

    m = al.Mock({"Q: 2+2\nA:": " 4\nQ: next"})
    st = prog.run(question="2+2", backend=m)
    assert st["answer"] == " 4"
    assert st.get_meta_info("answer")["finish_reason"] == {"type": "stop", "matched": "\n"}
    assert st.text() == "Q: 2+2\nA: 4"


def test_gen_options_merge_over_run_defaults_and_reach_backend():
    @al.function
    def prog(s):
        s += al.gen("x", max_tokens=7, temperature=0.7, top_k=5, stop="END", seed=3,
                    frequency_penalty=0.5, presence_penalty=0.25, min_tokens=2, ignore_eos=True,
                    stop_token_ids=[9], min_p=0.1, top_p=0.9)
        s += al.gen("y")

    m = al.Mock()
    prog.run(backend=m, max_new_tokens=11, temperature=0.2, top_p=0.5)
    x, y = [c.options for c in m.calls]
    assert (x.max_tokens, x.temperature, x.top_k, x.seed, x.min_tokens) == (7, 0.7, 5, 3, 2)
    assert (x.frequency_penalty, x.presence_penalty, x.ignore_eos, x.min_p, x.top_p) == \
        (0.5, 0.25, True, 0.1, 0.9)
    assert x.stop_token_ids == (9,)
    assert x.stop == ("END", "<|im_end|>")   # the chat template's stop string is added
    assert (y.max_tokens, y.temperature, y.top_p, y.top_k) == (11, 0.2, 0.5, -1)


def test_gen_int_string_float_bool_values():
    @al.function
    def prog(s):
        s += al.gen_int("i") + " " + al.gen_string("s") + " " + al.gen("f", dtype=float) + " " \
            + al.gen("b", dtype=bool)

    st = prog.run(backend=al.Mock())
    assert isinstance(st["i"], int) and isinstance(st["f"], float) and isinstance(st["b"], bool)
    assert isinstance(st["s"], str) and '"' + st["s"] + '"' in st.text()
    assert str(st["i"]) in st.text()


def test_regex_constants_and_regex_gen():
    assert al.REGEX_INT == al.ir.REGEX_INT == r"[-+]?[0-9]+[ \n]*"
    assert al.REGEX_FLOAT and al.REGEX_BOOL == r"(True|False)" and al.REGEX_STR

    @al.function
    def prog(s):
        s += "ip: " + al.gen("ip", regex=r"\d{1,3}(\.\d{1,3}){3}") + "\n"
        s += "n: " + al.gen("n", regex=al.REGEX_INT)
        s += " ok: " + al.gen("ok", regex=al.REGEX_BOOL)

    st = prog.run(backend=al.Mock())
    assert re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", st["ip"])
    assert re.fullmatch(al.REGEX_INT, st["n"])
    assert st["ok"] in ("True", "False")


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_json_schema_dict_and_pydantic():
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "pop": {"type": "integer", "minimum": 0}},
              "required": ["city", "pop"]}

    @al.function
    def prog(s):
        s += al.gen("d", json_schema=schema) + "\n" + al.gen("p", json_schema=Person)

    m = al.Mock()
    st = prog.run(backend=m)
    jsonschema.validate(json.loads(st["d"]), schema)
    assert Person.model_validate_json(st["p"]).age >= -1
    assert last_gen_options(m).json_schema is Person


def test_grammar_gen_parses():
    import lark

    grammar = 'start: "(" expr ")"\nexpr: NUMBER ("+" NUMBER)*\n%import common.NUMBER'

    @al.function
    def prog(s):
        s += al.gen("e", grammar=grammar)

    st = prog.run(backend=al.Mock())
    lark.Lark(grammar).parse(st["e"])


def test_select_scores_and_methods():
    @al.function
    def prog(s, method):
        s += "Answer: " + al.select("c", ["yes", "no", "maybe"], choices_method=method)

    m = al.Mock({"Answer: ": "no"})
    for method in (al.token_length_normalized, al.greedy_token_selection,
                   al.unconditional_likelihood_normalized):
        st = prog.run(method=method, backend=m)
        assert st["c"] == "no" and st.text() == "Answer: no"
        assert len(st.get_meta_info("c")["scores"]) == 3
    assert any(c.kind == "score" and c.prompt == "" for c in m.calls)  # unconditional scoring


def test_gen_with_choices_is_select():
    @al.function
    def prog(s):
        s += "Color: " + al.gen("c", choices=["red", "blue"])

    m = al.Mock({"Color: ": "blue"})
    assert prog.run(backend=m)["c"] == "blue"
    assert [c.kind for c in m.calls] == ["score"]


def test_select_temperature_samples_from_choices():
    @al.function
    def prog(s):
        s += al.select("c", ["a", "b", "c"], temperature=5.0)

    seen = {prog.run(backend=al.Mock(), seed=k)["c"] for k in range(30)}
    assert seen <= {"a", "b", "c"} and len(seen) > 1


def test_roles_render_through_template_with_default_system():
    @al.function
    def prog(s):
        s += al.user("hi")
        s += al.assistant(al.gen("r", max_tokens=2))

    st = prog.run(backend=al.Mock({"assistant\n": "yo"}))
    assert st.text() == (f"<|im_start|>system\n{SYS}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                         "<|im_start|>assistant\nyo<|im_end|>\n")
    assert st.messages() == [{"role": "system", "content": SYS},
                             {"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "yo"}]
    # identical to the template rendering the same messages
    assert chatml(SYS).render(st.messages()[1:]) == st.text()


def test_role_begin_end_forms_and_with_blocks():
    @al.function
    def prog(s):
        s += al.system_begin() + "S" + al.system_end()
        with s.user():
            s += "U"
        s += al.user_begin() + "V" + al.user_end()
        s += al.assistant_begin() + al.gen("a", max_tokens=1) + al.assistant_end()
        s.assistant("done")

    st = prog.run(backend=al.Mock())
    assert [m["role"] for m in st.messages()] == ["system", "user", "user", "assistant",
                                                  "assistant"]
    assert st.messages()[0]["content"] == "S" and st.messages()[-1]["content"] == "done"
    assert st.text().startswith("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU")


def test_var_scope_set_var_contains_and_meta():
    @al.function
    def prog(s):
        with s.var_scope("block"):
            s += "abc" + al.gen("g", max_tokens=2)
        s["manual"] = 42

    st = prog.run(backend=al.Mock({"abc": "XY"}))
    assert st["block"] == "abcXY" and st["g"] == "XY" and st["manual"] == 42
    assert "block" in st and "nope" not in st
    assert st.get_meta_info("g")["completion_tokens"] == 2
    with pytest.raises(KeyError, match="no variable 'nope'"):
        st["nope"]


def test_return_logprob_meta():
    @al.function
    def prog(s):
        s += al.gen("x", max_tokens=3, return_logprob=True, top_logprobs_num=2)

    st = prog.run(backend=al.Mock({"": "abc"}))
    meta = st.get_meta_info("x")
    assert [tid for _, tid in meta["output_token_logprobs"]] == [ord(c) for c in "abc"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_positional_args_bind_and_ret_value():
    @al.function
    def prog(s, a, b="B"):
        s += a + b
        return "ret"

    m = al.Mock()
    assert prog.run("x", backend=m).text() == "xB"
    st = prog.bind(b="Q").run(a="z", backend=m)
    assert st.text() == "zQ" and st.ret_value == "ret"
    with pytest.raises(ValueError, match="has no argument 'c'"):
        prog.run(a="x", c=1, backend=m)
    with pytest.raises(ValueError, match="missing arguments: \\['a'\\]"):
        prog.run(backend=m)
    with pytest.raises(ValueError, match="has no argument 'zz'"):
        prog.bind(zz=1)


def test_calling_a_program_from_another():
    @al.function
    def answer(s, q):
        s += "Q: " + q + "\nA: " + al.gen("a", stop="\n")

    @al.function
    def two(s):
        s += answer(q="one")             # as an expression
        s += "\n"
        answer(s, "two")                 # direct call on the state
        s += "\nfirst+second"

    m = al.Mock({"Q: one\nA: ": "1", "Q: two\nA: ": "2"})
    st = two.run(backend=m)
    assert st.text() == "Q: one\nA: 1\nQ: two\nA: 2\nfirst+second"
    assert st["a"] == "2"


def test_default_backend():
    @al.function
    def prog(s):
        s += al.gen("x", max_tokens=2)

    old = al.get_default_backend()
    try:
        al.set_default_backend(None)
        with pytest.raises(ValueError, match="no backend"):
            prog.run()
        al.set_default_backend(al.Mock({"": "ok"}))
        assert prog.run()["x"] == "ok"
        with pytest.raises(ValueError, match="needs an agentlang backend"):
            al.set_default_backend("mock")
    finally:
        al.set_default_backend(old)


def test_worker_errors_surface_in_program_thread():
    @al.function
    def prog(s):
        s += al.gen("x", dtype=int, max_tokens=1)

    m = al.Mock(lambda prompt: None)
    m._typed = staticmethod(lambda *a: "abc")  # a backend returning a non-int
    with pytest.raises(ValueError, match="not a int"):
        prog.run(backend=m)
