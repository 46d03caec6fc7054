"""``sglang.lang.ir``'s public names: the typed-generation regexes."""

from agentlang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

__all__ = ["REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR"]
