"""Model families over shared layers: the Llama-family model (`llama`), its config, RoPE, the GGUF
variant on quantized blocks and its one-call native decode layer, and loading from HF
directories or GGUF files. Imports attention, cache, weights, quant and core."""
