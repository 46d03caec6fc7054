"""SGLang's import paths for its frontend language (``sglang.lang.*``), so a program that imports
from them runs with ``sys.modules["sglang"] = agentlang``. Each module re-exports agentlang's
own names; nothing is defined here."""
