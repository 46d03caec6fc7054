"""The tracer's prompt prefix is exactly the text the interpreter sends first.

``run_batch`` orders programs and caches shared prefixes by the traced text before each
program's first generation (compiler.prompt_key); if that text drifted from what the
interpreter really sends, the cached prefixes would silently miss. One program per IR node
kind that can come before the first generation, and one per generating kind."""

from __future__ import annotations

import dataclasses

import pytest

import agentlang as al
from agentlang.chat_template import chatml
from agentlang.compiler import prompt_key


@al.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@al.function
def inner(s, topic):
    s += "About " + topic + ". "


def text_gen(s):                    # Text, Concat, Gen
    s += "Hello " + "world: " + al.gen("a", max_tokens=4)


def roles(s):                       # RoleBegin / RoleEnd (default system prompt, preamble)
    s += al.system("Be brief.")
    with s.user():
        s += "Question?"
    s += al.assistant(al.gen("a", max_tokens=4))


def user_first(s):                  # the template's default system prompt is inserted
    s += al.user("Hi") + al.assistant_begin() + al.gen("a", max_tokens=4)


def var_scope(s):                   # VarScopeBegin / VarScopeEnd
    with s.var_scope("v"):
        s += "scoped text"
    s += " then " + al.gen("a", max_tokens=4)


def argument(s, question):          # a concrete Argument
    s += "Q: " + question + "\nA: " + al.gen("a", max_tokens=4)


def call(s, question):              # Call: a program composed inline
    s += inner(topic=question)
    s += al.gen("a", max_tokens=4)


def variable(s):                    # a variable set by the program and appended
    s["x"] = "seven"
    s += "x is " + s["x"] + ": " + al.gen("a", max_tokens=4)


def select(s):                      # Select (sends a score call)
    s += "Pick one: " + al.select("c", ["red", "blue"])


def tool_call(s):                   # ToolCall
    s += al.user("Add 2 and 3.") + al.assistant_begin() + al.tool_call([add], name="r")


def agent_loop(s):                  # AgentLoop
    s += al.user("Add 2 and 3.") + al.agent_loop([add], max_steps=1)


def fork_join(s):                   # Fork / Join: the prefix ends at the fork
    s += "Shared context. "
    forks = s.fork(2)
    forks += al.gen("a", max_tokens=4)
    forks.join()
    s += al.gen("b", max_tokens=4)


PROGRAMS = [text_gen, roles, user_first, var_scope, argument, call, variable, select,
            tool_call, agent_loop, fork_join]
ARGS = {"argument": {"question": "Why?"}, "call": {"question": "cats"}}


def first_prompt(backend: al.Mock) -> str:
    kinds = {"generate", "stream", "score"}
    return next(c.prompt for c in backend.calls if c.kind in kinds)


@pytest.mark.parametrize("preamble", ["", "<s>"])
@pytest.mark.parametrize("body", PROGRAMS, ids=lambda f: f.__name__)
def test_traced_prefix_is_what_the_interpreter_sends(body, preamble):
    template = dataclasses.replace(chatml("Default system."), preamble=preamble)

    class Backend(al.Mock):
        def chat_template(self):
            return template

    program = al.function(body)
    args = ARGS.get(body.__name__, {})
    backend = Backend()
    program.run(backend=backend, **args)
    sent = first_prompt(backend)
    traced = prompt_key(program, template, args)
    if body is agent_loop:   # the loop opens its own assistant turn, after the traced prefix
        assert sent == traced + template.open_role("assistant", first=False)[0]
    else:
        assert traced == sent
    if body is fork_join:                 # the prefix committed at the fork is the same text
        assert backend.prefix_events[0][2] == sent
