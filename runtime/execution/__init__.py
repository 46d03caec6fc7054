"""Runs one step's items through the model: batch metadata, eager forward or CUDA-graph
replay (:mod:`.model_runner`, :mod:`.cuda_graph`). Imports scheduler (its items), models,
attention and cache."""
