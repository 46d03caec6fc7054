"""SGLang's native protocol, exactly: ``/generate`` and its parameters and outputs, the info
and control routes (checked with SGLang's own frontend and sglang-router)."""
