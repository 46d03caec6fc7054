"""Runs programs of SGLang's own frontend test file (``sglang/test/test_programs.py`` from the
installed ``sglang`` wheel) against a server, concurrently in this process (one thread each,
at most ``--parallel`` at once; the frontend is imported once), and prints one JSON line per
program as it ends: ``{"test", "outcome", "detail"}``, then ``{"http_errors": [...]}``.

``python sglang_programs.py URL MODE LIMIT_S TEST [TEST ...]``; ``MODE`` is ``sglang``
(SGLang's real frontend, ``sgl.RuntimeEndpoint(URL)``) or ``agentlang``
(``sys.modules["sglang"] = agentlang``, its ``RuntimeEndpoint(URL)``). A program still running
after ``LIMIT_S`` seconds is reported as ``hang`` (SGLang's executor thread swallows a backend
error and the program then waits forever) and the process exits without waiting for it.

Outcomes: ``passed``; ``wrong_answer`` (an ``AssertionError`` about the content, allowed for a
135M model); ``api_error`` (any HTTP status other than 200, or an exception from the client or
the program). ``http_errors`` lists every non-200 answer the clients got (the threads share
one client, so an error is reported for the run: any is a failure of the test).

With SGLang's frontend the default backend is its ``Runtime`` attached to the running server
(launching nothing) — its own test suite sets an ``sgl.Runtime``; its interpreter unwraps
``.endpoint``, and ``test_gen_min_new_tokens`` reads
``global_config.default_backend.endpoint.get_model_name()``, which a bare SGLang
``RuntimeEndpoint`` lacks. agentlang's ``RuntimeEndpoint`` has ``.endpoint`` itself. Only the helper modules outside
the frontend language that the file imports are stubbed: ``sglang.srt.utils.is_hip`` in
``agentlang`` mode, and in both modes ``sglang.srt.utils.hf_transformers_utils.get_tokenizer``
(transformers' ``AutoTokenizer``; the real module imports SGLang's server configs, which need
torchvision, a GPU-stack package not installed here).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import traceback
import types

PROGRAMS = ("test_few_shot_qa", "test_mt_bench", "test_select", "test_decode_int",
            "test_decode_json_regex", "test_decode_json", "test_expert_answer", "test_tool_use",
            "test_react", "test_parallel_decoding", "test_parallel_encoding", "test_stream",
            "test_regex", "test_dtype_gen", "test_gen_min_new_tokens")


def _programs_file() -> str:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin, "the sglang wheel is not installed"
    return spec.origin.replace("__init__.py", "test/test_programs.py")


def _load(path: str):
    spec = importlib.util.spec_from_file_location("sglang_test_programs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _get_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _tokenizer_module() -> types.ModuleType:
    """Stand-in for ``sglang.srt.utils.hf_transformers_utils`` (its ``get_tokenizer``): the
    real module imports SGLang's server configs, which need torchvision."""
    hf = types.ModuleType("sglang.srt.utils.hf_transformers_utils")
    hf.get_tokenizer = _get_tokenizer
    return hf


def _sglang_backend(url: str, http_errors: list) -> None:
    import sglang as sgl
    import sglang.lang.backend.runtime_endpoint as re_mod

    real = re_mod.http_request

    def recording(u, *args, **kwargs):
        res = real(u, *args, **kwargs)
        if res.status_code != 200:
            http_errors.append([u, res.status_code, res.text[:300]])
        return res

    re_mod.http_request = recording
    sys.modules["sglang.srt.utils.hf_transformers_utils"] = _tokenizer_module()
    class Attached(re_mod.Runtime):
        """SGLang's ``Runtime`` attached to a running server (launches and stops nothing)."""

        def __init__(self):
            self.endpoint = sgl.RuntimeEndpoint(url)

        def shutdown(self):
            pass

    sgl.set_default_backend(Attached())


def _agentlang_backend(url: str, http_errors: list) -> None:
    import httpx

    import agentlang

    def hook(response: httpx.Response) -> None:
        if response.status_code != 200:
            response.read()
            http_errors.append([str(response.request.url), response.status_code,
                                response.text[:300]])

    sys.modules["sglang"] = agentlang
    srt = types.ModuleType("sglang.srt")
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_hip = lambda: False
    for name, mod in (("sglang.srt", srt), ("sglang.srt.utils", utils),
                      ("sglang.srt.utils.hf_transformers_utils", _tokenizer_module())):
        sys.modules[name] = mod
    backend = agentlang.RuntimeEndpoint(url)
    backend.client.event_hooks["response"].append(hook)
    agentlang.global_config.default_backend = backend


def _program_parses_json(error: BaseException, module) -> bool:
    """Whether ``error`` is a ``JSONDecodeError`` from the test program's own ``json.loads``
    of the model's text (its innermost frame outside the ``json`` package is in the programs
    file): content, like a failed assertion. SGLang's typed-gen regexes admit text JSON refuses
    (``REGEX_INT`` a leading zero, ``REGEX_STR`` a raw newline or tab), so at T 1 a 135M model
    sometimes writes it (``"area": 0663…``); SGLang's own server allows the same text."""
    if not isinstance(error, json.JSONDecodeError):
        return False
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if "/json/" not in f.filename.replace("\\", "/")]
    return bool(frames) and frames[-1].filename == module.__file__


def _one(module, test: str) -> dict:
    fn = getattr(module, test)
    kwargs = {"check_answer": True} if test == "test_select" else {}
    try:
        fn(**kwargs)
        outcome, detail = "passed", ""
    except AssertionError as e:
        outcome, detail = "wrong_answer", str(e)[:500]
    except Exception as e:  # noqa: BLE001 - reported to the test as an API error
        outcome = "wrong_answer" if _program_parses_json(e, module) else "api_error"
        detail = traceback.format_exc()[-2000:]
    return {"test": test, "outcome": outcome, "detail": detail}


def main(url: str, mode: str, limit_s: str, *tests: str, parallel: int = 8) -> None:
    import os
    import time
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    http_errors: list = []
    path = _programs_file()          # before agentlang mode puts itself in sys.modules
    (_sglang_backend if mode == "sglang" else _agentlang_backend)(url, http_errors)
    module = _load(path)
    pool = ThreadPoolExecutor(parallel)
    futures = {pool.submit(_one, module, t): t for t in tests}
    started = {t: None for t in tests}
    deadline_of = {}
    pending = set(futures)
    while pending:
        now = time.monotonic()
        for f in pending:
            if f.running() and started[futures[f]] is None:
                started[futures[f]] = now
                deadline_of[f] = now + float(limit_s)
        timeout = min((d for d in deadline_of.values()), default=now + 1) - now
        done, pending = wait(pending, timeout=max(0.05, min(timeout, 1.0)),
                             return_when=FIRST_COMPLETED)
        for f in done:
            print(json.dumps(f.result()), flush=True)
        late = [f for f in pending if f in deadline_of and time.monotonic() > deadline_of[f]]
        for f in late:
            print(json.dumps({"test": futures[f], "outcome": "hang",
                              "detail": f"over {limit_s} s"}), flush=True)
            pending.discard(f)
        for f in done | set(late):
            deadline_of.pop(f, None)
    print(json.dumps({"http_errors": http_errors}), flush=True)
    os._exit(0)                     # a hung program's threads never end: do not wait for them


if __name__ == "__main__":
    main(*sys.argv[1:])
