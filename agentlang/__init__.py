"""agentlang: agent programs as decorated Python functions (SGLang-compatible frontend).

    import agentlang as al

    @al.function
    def qa(s, question):
        s += al.system("You are terse.")
        s += al.user(question)
        s += al.assistant(al.gen("answer", max_tokens=32))

    al.set_default_backend(al.Runtime())
    print(qa.run(question="What is 2+2?", temperature=0)["answer"])
"""

from agentlang.agent import tools_prompt
from agentlang.api import (agent_loop, assistant, assistant_begin, assistant_end, function, gen,
                           gen_int, gen_string, get_default_backend, global_config, select,
                           separate_reasoning,
                           set_default_backend,
                           system, system_begin, system_end, tool_call, user, user_begin,
                           user_end)
from agentlang.backends.base import Backend, UnsupportedFeatureError
from agentlang.backends.mock import Mock
from agentlang.choices import (greedy_token_selection, token_length_normalized,
                               unconditional_likelihood_normalized)
from agentlang.graph import Graph
from agentlang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR, TraceError
from agentlang.program import Program
from agentlang.state import ForkGroup, ProgramState
from agentlang.tools import Tool, tool

ProgramStateGroup = ForkGroup  # SGLang's name


def __getattr__(name: str):
    # Backends with heavy or optional dependencies load on first use.
    if name == "Runtime":
        from agentlang.backends.runtime import Runtime
        return Runtime
    if name == "RuntimeEndpoint":
        from agentlang.backends.endpoint import RuntimeEndpoint
        return RuntimeEndpoint
    if name == "OpenAI":
        from agentlang.backends.openai import OpenAI
        return OpenAI
    raise AttributeError(f"module 'agentlang' has no attribute {name!r}")


__all__ = [
    "REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "Backend", "ForkGroup", "Graph",
    "Mock", "OpenAI", "Program", "ProgramState", "ProgramStateGroup", "Runtime",
    "RuntimeEndpoint", "Tool", "TraceError", "UnsupportedFeatureError", "agent_loop",
    "assistant", "assistant_begin", "assistant_end", "function", "gen", "gen_int",
    "gen_string", "get_default_backend", "global_config", "greedy_token_selection", "select", "separate_reasoning",
    "set_default_backend", "system", "system_begin", "system_end", "token_length_normalized",
    "tool", "tool_call", "tools_prompt", "unconditional_likelihood_normalized", "user",
    "user_begin", "user_end",
]
