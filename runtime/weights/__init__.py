"""Model files: resolving a model name or path, GGUF parsing and its tensors as blocks or
dense weights. Imports quant and core."""
