"""Backends without a model: chat-template derivation, Mock determinism, RuntimeEndpoint and
OpenAI wire formats against in-process fake servers (httpx.MockTransport)."""

import json

import httpx
import pydantic
import pytest

import agentlang as al
from tests.support import sglang_source
from agentlang.backends.base import Prompt, UnsupportedFeatureError
from agentlang.chat_template import derive_chat_template
from agentlang.sampling import make_options, run_defaults

SMOL_SYS = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smollm_render(messages, add_generation_prompt):
    out = ""
    for i, m in enumerate(messages):
        if i == 0 and messages[0]["role"] != "system":
            out += f"<|im_start|>system\n{SMOL_SYS}<|im_end|>\n"
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def llama3_render(messages, add_generation_prompt):
    out = "<|begin_of_text|>"
    for m in messages:
        out += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
    if add_generation_prompt:
        out += "<|start_header_id|>assistant<|end_header_id|>\n\n"
    return out


def llama2_render(messages, add_generation_prompt):
    sys = next((m["content"] for m in messages if m["role"] == "system"), None)
    out = ""
    for m in messages:
        if m["role"] == "user":
            c = (f"<<SYS>>\n{sys}\n<</SYS>>\n\n" if sys else "") + m["content"]
            out += f"<s>[INST] {c} [/INST]"
        elif m["role"] == "assistant":
            out += f" {m['content']} </s>"
    return out


CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
     {"role": "assistant", "content": "A"}, {"role": "user", "content": "U2"}],
]


@pytest.mark.parametrize("render, default, preamble", [
    (smollm_render, SMOL_SYS, ""), (llama3_render, None, "<|begin_of_text|>")])
def test_derived_template_renders_like_the_original(render, default, preamble):
    t = derive_chat_template(render)
    assert t.default_system_prompt == default and t.preamble == preamble
    for conv in CONVERSATIONS:
        assert t.render(conv, add_generation_prompt=True) == render(conv, True)


def test_program_text_equals_template_rendering():
    t = derive_chat_template(llama3_render)

    class Llama3Mock(al.Mock):
        def chat_template(self):
            return t

    @al.function
    def prog(s):
        s += al.user("hi")
        s += al.assistant("there")

    st = prog.run(backend=Llama3Mock())
    assert st.text() == llama3_render(st.messages(), False)


def test_unstructured_template_is_rejected():
    with pytest.raises(ValueError, match="chat template"):
        derive_chat_template(llama2_render)


def test_mock_is_deterministic():
    m1, m2 = al.Mock(), al.Mock()
    opts = run_defaults()
    for opts in (run_defaults(), make_options(regex=al.REGEX_FLOAT).merged_over(run_defaults()),
                 make_options(json_schema={"type": "array", "items": {"type": "number"}})
                 .merged_over(run_defaults())):
        a = m1.generate(Prompt("same prompt"), opts)
        assert a == m2.generate(Prompt("same prompt"), opts)
    assert m1.score("p", ["x", "yy"]) == m2.score("p", ["x", "yy"])
    assert m1.generate(Prompt("a"), run_defaults()) != m1.generate(Prompt("b"), run_defaults())


# -- RuntimeEndpoint against a fake SGLang server -------------------------------------------------
class FakeServer:
    """SGLang's /get_model_info and /generate over a Mock, recording every request and checking
    each /generate body against SGLang's own field lists (plus agentlang's declared top-level
    extensions): an agentlang-only field would be a 400 (inside sampling_params) or silently
    ignored (top level) by a real SGLang server."""

    def __init__(self, model_path):
        from agentlang.backends.endpoint import EXTENSIONS

        self.mock = al.Mock({"Answer: ": "yes", "Q: ": "streamed answer"}, chunk_size=4)
        self.requests = []
        self.model_path = str(model_path)
        if not sglang_source.installed():
            pytest.skip("the sglang frontend is installed by `make install`")
        self.top_fields = sglang_source.generate_fields() | set(EXTENSIONS)
        self.sampling_fields = set(sglang_source.sampling_fields())

    def check_fields(self, body: dict) -> None:
        assert set(body) <= self.top_fields, set(body) - self.top_fields
        sps = body.get("sampling_params") or {}
        for sp in sps if isinstance(sps, list) else [sps]:
            assert set(sp) <= self.sampling_fields, set(sp) - self.sampling_fields

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.requests.append((path, body, dict(request.headers)))
        if path == "/get_model_info":
            return httpx.Response(200, json={"model_path": self.model_path,
                                             "tokenizer_path": self.model_path})
        if path != "/generate":
            return httpx.Response(404, json={"detail": "Not Found"})
        self.check_fields(body)
        sp = body["sampling_params"]
        if sp.get("max_new_tokens", 1) > 1000:
            return httpx.Response(400, json={"error": {
                "message": "sampling_params.max_new_tokens: too big"}})
        if sp.get("max_new_tokens") == 0:
            texts = body["text"] if isinstance(body["text"], list) else [body["text"]]
            outs = [self.prefill(t, body) for t in texts]
            return httpx.Response(200, json=outs if isinstance(body["text"], list) else outs[0])
        names = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens",
                 "sampling_seed": "seed"}
        fields = {names.get(k, k): v for k, v in sp.items()}
        if "json_schema" in fields:
            fields["json_schema"] = json.loads(fields["json_schema"])
        opts = make_options(**fields).merged_over(run_defaults())
        result = self.mock.generate(Prompt(body["text"]), opts)
        final = {"text": result.text, "output_ids": [ord(c) for c in result.text],
                 "meta_info": {**result.meta, "finish_reason": {
                     "type": result.finish_reason, "matched": result.matched_stop}}}
        if body.get("return_logprob"):
            final["meta_info"]["output_token_logprobs"] = [[-0.5, ord(c), c]
                                                           for c in result.text]
        if not body.get("stream"):
            return httpx.Response(200, json=final)
        events = [json.dumps({**final, "text": result.text[:i]})
                  for i in range(0, len(result.text), 4)] + [json.dumps(final)]
        sse = "".join(f"data: {e}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})

    def prefill(self, text: str, body: dict) -> dict:
        """max_new_tokens 0: one "token" per character; logprobs from the Mock's scorer."""
        meta = {"prompt_tokens": len(text), "finish_reason": {"type": "length", "length": 0}}
        if body.get("return_logprob"):
            start = body.get("logprob_start_len", -1)
            lps = [None] + self.mock.score("", [text])[0][1:]
            meta["input_token_logprobs"] = [] if start < 0 else [
                [None if p == start else lps[p], ord(text[p]), None]
                for p in range(start, len(text))]
        return {"text": "", "output_ids": [], "meta_info": meta}


@pytest.fixture
def endpoint(model_path):
    server = FakeServer(model_path)
    backend = al.RuntimeEndpoint("http://fake", api_key="k3y",
                                 transport=httpx.MockTransport(server))
    yield backend, server
    backend.close()


def test_endpoint_program_with_roles_fork_select_and_schema(endpoint):
    backend, server = endpoint

    class Out(pydantic.BaseModel):
        ok: bool

    @al.function
    def prog(s):
        s += al.user("Is it?")
        s += al.assistant_begin() + "Answer: " + al.select("a", ["yes", "no"]) + "\n"
        forks = s.fork(2)
        forks += al.gen("j", json_schema=Out, max_tokens=30)
        forks.join()
        s += al.assistant_end()

    st = prog.run(backend=backend, temperature=0)
    assert all(Out.model_validate_json(j) for j in st["j"])
    assert st["a"] in ("yes", "no")
    assert st.text().startswith(f"<|im_start|>system\n{SMOL_SYS}")
    paths = {p for p, _, _ in server.requests}
    assert paths == {"/get_model_info", "/generate", "/close_session"}   # SGLang's routes only
    bodies = [b for p, b, _ in server.requests if p == "/generate"]
    # the run is one session (SGLang's top-level session_id), closed when the run ends
    sessions = {b["session_id"] for b in bodies if "program" in b}
    assert len(sessions) == 1 and sessions == {f"run-{bodies[-1]['program']['id']}"}
    closes = [b for p, b, _ in server.requests if p == "/close_session"]
    assert [c["session_id"] for c in closes] == list(sessions)
    assert server.requests[-1][0] == "/close_session"
    assert all(isinstance(b["text"], str) for b in bodies)  # sglang-router takes no batches
    assert any(b["sampling_params"] == {"max_new_tokens": 0} for b in bodies)  # fork prefix
    gen = next(b for b in bodies if "json_schema" in b["sampling_params"])
    assert json.loads(gen["sampling_params"]["json_schema"]) == Out.model_json_schema()
    assert gen["sampling_params"]["temperature"] == 0 and gen["stream"] is False
    assert all(h["authorization"] == "Bearer k3y" for _, _, h in server.requests)


def test_endpoint_streaming_logprobs_and_score(endpoint):
    backend, server = endpoint

    @al.function
    def prog(s):
        s += "Q: " + al.gen("a", max_tokens=40, return_logprob=True)

    st = prog.run(backend=backend, stream=True)
    assert list(st.text_iter("a")) == ["stre", "amed", " ans", "wer"]
    assert st.get_meta_info("a")["output_token_logprobs"][0] == (-0.5, ord("s"))
    want = backend.score("", ["ab"])
    assert want[0][0] is None and len(want[0]) == 2
    # after a prefix: the continuation's logprobs, position for position
    assert backend.score("xy", ["ab"]) == [server.mock.score("", ["xyab"])[0][2:]]


def test_endpoint_extensions_and_types(endpoint):
    backend, server = endpoint
    backend.generate(Prompt("Q: "), make_options(grammar='start: "a"').merged_over(
        run_defaults()))
    backend.generate(Prompt("Q: "), make_options(dtype=int).merged_over(run_defaults()))
    grammar, typed = [b for p, b, _ in server.requests if p == "/generate"]
    assert grammar["lark_grammar"] == 'start: "a"'
    assert typed["sampling_params"]["regex"] == al.REGEX_INT


def test_typed_numbers_stop_at_whitespace_as_sglang_does(endpoint):
    """SGLang's frontend ends an int / float gen at its first space or newline (the regexes
    admit trailing whitespace, and a sampled number would otherwise run on in blank lines to
    max_tokens); the other stops stay, a str gen gets none."""
    backend, server = endpoint

    @al.function
    def prog(s):
        s += "Q: " + al.gen_int("i") + al.gen("f", dtype=float) + al.gen_string("s")

    prog.run(backend=backend, stop=["END"])
    stops = [b["sampling_params"].get("stop") for p, b, _ in server.requests
             if p == "/generate"]
    run = ["<|im_end|>", "END"]                   # the run's stop and the template's
    assert [sorted(x) for x in stops] == [sorted(["\n", " ", *run])] * 2 + [run]


def test_typed_str_keeps_the_whitespace_its_regex_admits():
    from agentlang.interpreter import typed_value

    assert typed_value('"D\n\t2014"', "str", "s") == "D\n\t2014"    # REGEX_STR's \\s
    with pytest.raises(ValueError, match="not a int"):
        typed_value("12ab", "int", "i")


def test_endpoint_errors_name_the_field(endpoint):
    backend, _ = endpoint
    with pytest.raises(ValueError, match="max_new_tokens: too big"):
        backend.generate(Prompt("x"), make_options(max_tokens=5000).merged_over(run_defaults()))
    with pytest.raises(ValueError, match="must be an http"):
        al.RuntimeEndpoint("localhost:3000")
    assert backend.get_model_info()["model_path"] == backend.endpoint.get_model_name()


# -- OpenAI against a fake OpenAI-compatible server -----------------------------------------
def openai_handler(log, logprobs=True):
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        log.append((request.url.path, body))
        if request.url.path.endswith("/chat/completions"):
            text = "chat reply"
            if body.get("stream"):
                chunks = [{"id": "c", "object": "chat.completion.chunk", "created": 0,
                           "model": "m", "choices": [{"index": 0, "delta": {"content": piece},
                                                      "finish_reason": None}]}
                          for piece in ("chat ", "reply")]
                chunks[-1]["choices"][0]["finish_reason"] = "stop"
                sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                return httpx.Response(200, text=sse,
                                      headers={"content-type": "text/event-stream"})
            return httpx.Response(200, json={
                "id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})
        prompt = body["prompt"]
        lp = None
        if body.get("echo") and logprobs:
            offsets = list(range(len(prompt)))
            scores = [-0.1 if "yes" in prompt[max(0, i - 2):i + 3] else -3.0 for i in offsets]
            lp = {"tokens": list(prompt), "token_logprobs": [None] + scores[1:],
                  "text_offset": offsets, "top_logprobs": None}
        return httpx.Response(200, json={
            "id": "t", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": "" if body.get("echo") else " completion",
                         "finish_reason": "length", "logprobs": lp}]})
    return handle


def make_openai(log, api="chat", logprobs=True, **kw):
    import openai

    client = openai.OpenAI(api_key="x", base_url="http://fake/v1", http_client=httpx.Client(
        transport=httpx.MockTransport(openai_handler(log, logprobs))))
    return al.OpenAI("m", api=api, client=client, **kw)


def test_openai_chat_messages_and_response_format():
    log = []
    backend = make_openai(log)

    @al.function
    def prog(s):
        s += al.system("Be brief.")
        s += al.user("Hi")
        s += al.assistant(al.gen("r", max_tokens=9, json_schema={"type": "object"}))

    st = prog.run(backend=backend, temperature=0)
    assert st["r"] == "chat reply" and st.get_meta_info("r")["prompt_tokens"] == 5
    path, body = log[-1]
    assert path.endswith("/chat/completions")
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi"}]
    assert body["response_format"]["type"] == "json_schema"
    assert body["max_tokens"] == 9 and "stop" not in body

    @al.function
    def streamed(s):
        s += al.user("Hi") + al.assistant(al.gen("r"))

    st = streamed.run(backend=backend, stream=True)
    assert list(st.text_iter("r")) == ["chat ", "reply"]


@pytest.mark.parametrize("expr, match", [
    (lambda: al.gen("x", regex="a+"), "cannot honour regex"),
    (lambda: al.gen("x", grammar='start: "a"'), "cannot honour grammar"),
    (lambda: al.gen_int("x"), "cannot honour dtype"),
    (lambda: al.gen("x", top_k=5), "cannot honour top_k"),
    (lambda: al.gen("x", stop_token_ids=[3]), "cannot honour stop_token_ids"),
    (lambda: al.select("x", ["a", "b"]), "does not return"),
])
def test_openai_unsupported_features_raise(expr, match):
    @al.function
    def prog(s):
        s += al.user("Hi") + al.assistant(expr())

    with pytest.raises(UnsupportedFeatureError, match=match):
        prog.run(backend=make_openai([]))


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_openai_extended_sampling_goes_in_the_body(api):
    """A server with vLLM's / SGLang's sampling fields (``extended_sampling=True``): they are
    sent as body fields (only those set; top_k 1 and min_tokens 1 included), not refused."""
    log = []
    backend = make_openai(log, api=api, extended_sampling=True)

    @al.function
    def prog(s):
        s += al.user("Hi") + al.assistant(al.gen("x", max_tokens=6, ignore_eos=True, top_k=1,
                                                 min_tokens=1, repetition_penalty=1.1))

    prog.run(backend=backend)
    body = log[-1][1]
    assert body["ignore_eos"] is True and body["top_k"] == 1 and body["min_tokens"] == 1
    assert body["repetition_penalty"] == 1.1 and "min_p" not in body
    prog.run(backend=backend, ignore_eos=False)
    assert log[-1][1]["ignore_eos"] is True                # the gen's own setting wins
    @al.function
    def fixed(s):
        s += al.user("Hi") + al.assistant(al.gen("x", max_tokens=6, ignore_eos=True))

    with pytest.raises(UnsupportedFeatureError, match="cannot honour ignore_eos"):
        fixed.run(backend=make_openai([], api=api))         # a plain OpenAI server


def test_openai_chat_needs_a_fresh_assistant_turn():
    @al.function
    def prog(s):
        s += al.user("Hi") + al.assistant_begin() + "Sure: " + al.gen("x")

    with pytest.raises(UnsupportedFeatureError, match="whole assistant message"):
        prog.run(backend=make_openai([]))


def test_openai_completions_api_select_and_no_prefix_cache():
    log = []
    backend = make_openai(log, api="completions")

    @al.function
    def prog(s):
        s += "Answer: " + al.select("a", ["no", "yes"]) + "\n"
        forks = s.fork(2)
        forks += al.gen("g", max_tokens=4)
        forks.join()

    st = prog.run(backend=backend)
    assert st["a"] == "yes" and st["g"] == [" completion", " completion"]
    assert all(body.get("echo") for p, body in log[:2])
    assert log[2][1]["prompt"] == "Answer: yes\n" and log[2][1]["max_tokens"] == 4
    assert not backend.capabilities.prefix_cache
    with pytest.raises(UnsupportedFeatureError, match="no prefix cache"):
        backend.cache_prefix("x")


def test_openai_server_without_prompt_logprobs_cannot_select():
    @al.function
    def prog(s):
        s += "A: " + al.select("a", ["x", "y"])

    with pytest.raises(UnsupportedFeatureError, match="did not return prompt logprobs"):
        prog.run(backend=make_openai([], api="completions", logprobs=False))


def test_preamble_and_default_system_are_emitted_once():
    import dataclasses

    from agentlang.chat_template import chatml

    template = dataclasses.replace(chatml("D"), preamble="<s>")

    class PreambleMock(al.Mock):
        def chat_template(self):
            return template

    @al.function
    def prog(s):
        s += al.user("u") + al.assistant("a") + al.user("v")

    st = prog.run(backend=PreambleMock())
    assert st.text() == template.render(st.messages()[1:])
    assert st.text().count("<s>") == 1 and st.text().startswith("<s><|im_start|>system\nD")
    assert prog.trace(backend=PreambleMock()).prompt_prefix == st.text()
