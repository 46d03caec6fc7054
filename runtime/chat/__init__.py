"""A model family's chat conventions, read from its chat template: how it writes tool calls
and reasoning blocks (:mod:`.family`), and rendering messages with its template. Imports
grammar (the call formats) and weights (the load error type)."""
