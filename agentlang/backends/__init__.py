"""Backends: one small interface (base.py), four implementations."""

from agentlang.backends.base import (Backend, Capabilities, GenResult, Prompt, StreamDelta,
                                     UnsupportedFeatureError)
from agentlang.backends.mock import Mock

__all__ = ["Backend", "Capabilities", "GenResult", "Mock", "Prompt", "StreamDelta",
           "UnsupportedFeatureError"]
