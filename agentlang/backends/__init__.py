"""Backends: one small interface (base.py), four implementations."""

from agentlang.backends.base import (Backend, Capabilities, GenDelta, GenResult, Prompt,
                                     UnsupportedFeatureError)
from agentlang.backends.mock import Mock

__all__ = ["Backend", "Capabilities", "GenDelta", "GenResult", "Mock", "Prompt",
           "UnsupportedFeatureError"]
