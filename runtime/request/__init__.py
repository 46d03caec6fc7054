"""What one request is while it runs and what it returns: :class:`.request.Request` and its
group, the prompt input types, the incremental detokenizer, the output records. Imports
sampling, grammar, cache (types) and core."""
