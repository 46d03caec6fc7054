"""agentlang programs on the embedded model, through the in-process engine (``Runtime``) and
through a real server subprocess (``RuntimeEndpoint``). Greedy decoding throughout."""

import asyncio
import importlib.util
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import pydantic
import pytest

import agentlang as al
from data.dsl_tools import multiply, to_fahrenheit

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runtime():
    backend = al.Runtime(kv_budget_mb=256)
    yield backend
    backend.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint():
    if importlib.util.find_spec("agentlang.runtime.server.cli") is None:
        pytest.skip("the server (python -m agentlang.runtime.server) is not built yet")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentlang.runtime.server", "--host", "127.0.0.1",
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("server did not become healthy in 120 s")
        time.sleep(0.25)
    backend = al.RuntimeEndpoint(url)
    yield backend
    backend.close()
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(params=["runtime", "endpoint"])
def backend(request):
    return request.getfixturevalue(request.param)


# -- programs -------------------------------------------------------------------------------
@al.function
def few_shot_qa(s, question):
    s += "The following are questions with answers.\n\n"
    s += "Q: What is the capital of France?\nA: Paris\n\n"
    s += "Q: What is the capital of Germany?\nA: Berlin\n\n"
    s += "Q: " + question + "\nA:" + al.gen("answer", stop="\n", max_tokens=16)


CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima", "Kenya": "Nairobi"}


def test_few_shot_qa_with_stop(backend):
    st = few_shot_qa.run(question="What is the capital of Italy?", backend=backend,
                         temperature=0)
    assert st["answer"].strip() == "Rome"
    assert st.get_meta_info("answer")["finish_reason"] == {"type": "stop", "matched": "\n"}
    assert st.text().endswith("A: Rome")


def test_select(backend):
    @al.function
    def sky(s):
        s += "Q: What color is the sky on a clear day?\nA: The sky is "
        s += al.select("color", ["blue", "green", "purple"])

    st = sky.run(backend=backend)
    assert st["color"] == "blue"
    scores = st.get_meta_info("color")["scores"]
    assert len(scores) == 3 and all(math.isfinite(x) and x < 0 for x in scores)


def test_gen_int(backend):
    @al.function
    def legs(s):
        s += "Q: How many legs does a dog have?\nA: " + al.gen_int("n", max_tokens=4)

    st = legs.run(backend=backend, temperature=0)
    assert isinstance(st["n"], int)
    assert re.fullmatch(r"-?\d+", st.text().split("A: ")[-1].strip())


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_json_by_regex_and_by_schema(backend):
    regex = r'\{"name": "[A-Za-z ]{1,16}", "age": [0-9]{1,3}\}'

    @al.function
    def extract(s):
        s += al.user("Alice is 31 years old. Reply with JSON giving her name and age.")
        s += al.assistant_begin() + al.gen("by_regex", regex=regex, max_tokens=32)
        s += al.assistant_end() + al.user("Again, as JSON.")
        s += al.assistant(al.gen("by_schema", json_schema=Person, max_tokens=48))

    st = extract.run(backend=backend, temperature=0)
    assert re.fullmatch(regex, st["by_regex"])
    assert set(json.loads(st["by_regex"])) == {"name", "age"}
    assert isinstance(Person.model_validate_json(st["by_schema"]).age, int)


def test_react_loop_with_select_and_python_tool(backend):
    observed = []

    def lookup(country: str) -> str:
        observed.append(country)
        return CAPITALS[country]

    @al.function
    def react(s, question):
        s += ("Answer questions by looking facts up.\n\n"
              "Question: What is the capital of Italy?\nAction: lookup\nCountry: Italy\n"
              "Observation: Rome\nAction: finish\nAnswer: Rome\n\n")
        s += "Question: " + question + "\n"
        for _ in range(3):
            s += "Action: " + al.select("action", ["lookup", "finish"]) + "\n"
            if s["action"] == "finish":
                break
            s += "Country: " + al.select("country", list(CAPITALS)) + "\n"
            s += "Observation: " + lookup(s["country"]) + "\n"
        s += "Answer:" + al.gen("answer", max_tokens=8, stop="\n")

    st = react.run(question="What is the capital of Peru?", backend=backend, temperature=0)
    assert observed == ["Peru"]
    assert "Observation: Lima\nAction: finish\n" in st.text()
    assert st["answer"].strip() == "Lima"


@al.function
def skeleton_of_thought(s, question):
    s += al.user(question + " Give three short points.")
    s += al.assistant_begin() + "Here are three points:\n"
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += str(i + 1) + "." + al.gen("point", max_tokens=12, stop="\n")
    forks.join()
    for i, point in enumerate(s["point"]):
        s += str(i + 1) + "." + point + "\n"
    s += "In summary," + al.gen("summary", max_tokens=16, stop="\n") + al.assistant_end()


def test_skeleton_of_thought_fork_join(backend):
    st = skeleton_of_thought.run(question="How can I sleep better?", backend=backend,
                                 temperature=0)
    points = st["point"]
    assert len(points) == 3 and all(p.strip() for p in points)
    assert "3." + points[2] + "\nIn summary," in st.text()
    assert st.messages()[-1]["role"] == "assistant" and st["summary"]


def test_streaming_text_iter(backend):
    st = few_shot_qa.run(question="What is the capital of Spain?", backend=backend,
                         temperature=0, stream=True)
    chunks = list(st.text_iter("answer"))
    assert "".join(chunks) == st["answer"] and st["answer"].strip() == "Madrid"
    st = skeleton_of_thought.run(question="How do I learn to cook?", backend=backend,
                                 temperature=0, stream=True)
    pieces = list(st.text_iter())
    assert len(pieces) > 3 and "".join(pieces) == st.text()


def test_program_called_outside_a_program_runs(backend):
    """As in SGLang: a call outside a running program runs it (run's keywords, sampling
    options and stream=True included); inside one it composes."""
    previous = al.global_config.default_backend
    al.global_config.default_backend = backend
    try:
        assert al.get_default_backend() is backend
        st = few_shot_qa(question="What is the capital of Spain?", temperature=0)
        assert isinstance(st, al.ProgramState) and st["answer"].strip() == "Madrid"
        streamed = few_shot_qa(question="What is the capital of Spain?", temperature=0,
                               stream=True)
        assert "".join(streamed.text_iter("answer")) == st["answer"]

        @al.function
        def outer(s):
            s += "Warm-up. " + few_shot_qa(question="What is the capital of Spain?")

        composed = outer.run(temperature=0)
        assert composed["answer"] == st["answer"] and composed.text().startswith("Warm-up. ")
    finally:
        al.global_config.default_backend = previous
    assert (Path(backend.endpoint.get_model_name()) / "config.json").is_file()


def test_run_batch_of_16_with_progress_bar(backend, capsys):
    countries = ["Italy", "Spain", "Japan", "Egypt", "Canada", "Greece", "Norway", "Peru",
                 "Kenya", "Chile", "Cuba", "Poland", "Sweden", "Ireland", "Austria", "Nepal"]
    is_local = isinstance(backend, al.Runtime)
    if is_local:
        backend.engine.flush_cache()
        before = backend.metrics()
    states = few_shot_qa.run_batch(
        [{"question": f"What is the capital of {c}?"} for c in countries],
        backend=backend, progress_bar=True, temperature=0, max_new_tokens=8)
    answers = [st["answer"].strip() for st in states]
    assert len(answers) == 16 and all(answers)
    assert answers[:3] == ["Rome", "Madrid", "Tokyo"]
    assert "16/16" in capsys.readouterr().err
    if is_local:  # the shared few-shot prefix was cached before the batch: every program hits
        after = backend.metrics()
        shared = len(backend.engine.tokenizer.encode(few_shot_qa.trace().constant_prefix))
        page = backend.engine.config.page_size
        hit = after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
        assert hit >= 16 * (shared // page * page)


def test_tool_calling_pipeline_validates_arguments(backend):
    @al.function
    def pipeline(s, request):
        s += al.system(al.tools_prompt([multiply, to_fahrenheit], final_answer=False))
        s += al.user(request)
        s += al.assistant(al.tool_call([multiply, to_fahrenheit], name="result", max_tokens=48))
        s += al.user("Tool result: " + json.dumps(s["result"]) + ". Summarize it.")
        s += al.assistant(al.gen("summary", max_tokens=16))

    st = pipeline.run(request="What is 6 times 7?", backend=backend, temperature=0)
    meta = st.get_meta_info("result")
    tool = {"multiply": multiply, "to_fahrenheit": to_fahrenheit}[meta["tool"]]
    jsonschema.validate(meta["arguments"], tool.parameters)
    assert st["result"] == tool(**meta["arguments"])
    assert json.loads(meta["call_text"]) == {"name": meta["tool"],
                                             "arguments": meta["arguments"]}


def test_arun_eight_programs_concurrently(backend):
    countries = ["Italy", "Spain", "Japan", "Egypt", "Canada", "Greece", "Norway", "Peru"]

    async def main():
        return await asyncio.gather(*(
            few_shot_qa.arun(question=f"What is the capital of {c}?", backend=backend,
                             temperature=0, max_new_tokens=8) for c in countries))

    states = asyncio.run(main())
    assert [st["answer"].strip() for st in states][:3] == ["Rome", "Madrid", "Tokyo"]
    assert all(st["answer"].strip() for st in states)


def test_fork_shares_a_500_token_prefix(runtime):
    engine = runtime.engine
    tok = engine.tokenizer
    words, prefix = [], ""
    while len(tok.encode(prefix)) < 500:
        words.append(f"item{len(words)}")
        prefix = "Inventory: " + " ".join(words) + "\n"
    prefix_tokens = len(tok.encode(prefix))
    page = engine.config.page_size

    @al.function
    def four_ways(s, text):
        s += text
        forks = s.fork(4)
        forks += lambda i: "Idea " + str(i) + ":" + al.gen("idea", max_tokens=8)
        forks.join()

    engine.flush_cache()
    engine.reset_peak()
    before = runtime.metrics()
    st = four_ways.run(text=prefix, backend=runtime, temperature=0)
    after = runtime.metrics()
    assert len(st["idea"]) == 4
    hit = after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
    assert hit >= 3 * 500
    # prompt tokens computed: the prefix once (cache_prefix) plus each branch's short tail
    computed = (after["prompt_tokens"] - before["prompt_tokens"]) - hit
    assert computed < prefix_tokens + 4 * 2 * page
    prefix_pages = math.ceil(prefix_tokens / page)
    branch_pages = math.ceil((8 + 8) / page) + 1   # tail + 8 generated, + copied partial page
    assert after["peak_pages_used"] - before["pages_used"] < prefix_pages + 4 * branch_pages
    deadline = time.time() + 5   # the join released the pinned prefix
    while runtime.metrics()["pages_protected"] and time.time() < deadline:
        time.sleep(0.05)
    assert runtime.metrics()["pages_protected"] == 0
