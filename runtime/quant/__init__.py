"""Quantized linear layers over GGUF blocks: the native library (C sources beside their
loader in :mod:`.native`), block-native linears and torch's int4/int8 fallback. Imports core."""
