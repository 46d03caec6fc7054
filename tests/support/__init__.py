"""What tests (and the benchmarks, which may import it back) share: real processes on free
loopback ports (:mod:`.cluster`), greedy decoding straight through a model
(:mod:`.greedy_decode`), small random-weight models (:mod:`.models`). Nothing here imports
bench/."""
