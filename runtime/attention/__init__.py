"""Attention backends over the paged KV pool: the torch reference path (CPU), the Triton
kernels (GPU), the decode cascade and the batch metadata they read (`forward_batch`)."""
