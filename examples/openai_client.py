"""The agentlang server from the official `openai` client: chat, streaming, JSON schema, tools.

    python -m agentlang.runtime.server --port 30000 &                  # or: agentlang serve
    python examples/openai_client.py --url http://127.0.0.1:30000

Without `--url` the example starts a server subprocess on a free port itself (and stops it
at the end), so `python examples/openai_client.py` works on its own.
"""

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import time

import httpx
import jsonschema
from openai import OpenAI
from pydantic import BaseModel

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 20},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}


class City(BaseModel):
    name: str
    country: str


def main(url, max_tokens=48):
    client = OpenAI(base_url=url + "/v1", api_key="unused")  # --api-key servers need the key
    model = client.models.list().data[0].id
    question = [{"role": "user", "content": "What is the capital of France?"}]

    # 1. Chat completion.
    chat = client.chat.completions.create(model=model, messages=question,
                                          max_tokens=max_tokens, temperature=0)
    answer = chat.choices[0].message.content
    assert "Paris" in answer, answer

    # 2. Streaming: the same greedy answer, delivered token by token.
    stream = client.chat.completions.create(model=model, messages=question,
                                            max_tokens=max_tokens, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream
                       if chunk.choices)
    assert streamed == answer, (streamed, answer)

    # 3. Structured output: the reply is constrained to a JSON schema.
    city = client.chat.completions.create(
        model=model, max_tokens=max_tokens, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of Japan? Reply in JSON "
                                              "with the city name and its country."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": City.model_json_schema()}})
    city = City.model_validate_json(city.choices[0].message.content)
    assert city.name == "Tokyo", city

    # 4. Tools: tool_choice="required" forces a call whose arguments match the schema.
    messages = [{"role": "user", "content": "What's the weather in Oslo?"}]
    reply = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL],
                                           tool_choice="required", max_tokens=max_tokens,
                                           temperature=0)
    (call,) = reply.choices[0].message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather"
    jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])
    # Run the tool ourselves and send its result back; tool_choice="none" asks for prose.
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "4 degrees and rain"},
                 {"role": "user", "content": "Using that result, answer in one sentence."}]
    final = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL],
                                           tool_choice="none", max_tokens=max_tokens,
                                           temperature=0)
    assert "4 degrees" in final.choices[0].message.content, final  # the tool result was used
    return {"chat": answer, "json": city, "tool_call": arguments,
            "after_tool": final.choices[0].message.content}


@contextlib.contextmanager
def local_server(timeout=180):
    """Start `python -m agentlang.runtime.server` on a free port; yield its URL; stop it on exit."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "agentlang.runtime.server", "--port", str(port),
                             "--log-level", "warning"])
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, "the server exited while starting"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health").status_code == 200:
                    break
            assert time.monotonic() < deadline, "the server did not start in time"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="agentlang server URL (default: start one here)")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    with (contextlib.nullcontext(args.url) if args.url else local_server()) as url:
        for key, value in main(url, max_tokens=args.max_tokens).items():
            print(f"{key}: {value}")
