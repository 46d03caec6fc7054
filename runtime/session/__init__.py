"""Sessions: an agent's conversation as a tree of turns, kept across tool calls (SGLang's API)."""
