"""A request's sampling parameters (:mod:`.params`: fields, ranges, the greedy threshold) and
the sampler that turns logits rows into tokens and logprobs (:mod:`.sampler`). Imports grammar
(constraint fields) and core only."""
