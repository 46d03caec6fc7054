"""Leaf vocabulary every layer may use: typed errors, value-type regexes, the priority range
and policy, agent labels and their totals, OpenMP thread pools. Imports nothing of the runtime."""
