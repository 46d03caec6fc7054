"""KV memory: the paged pool and its quantized storage, the page allocator (refcounts),
page tables (copy-on-write), the radix prefix cache (tree, LRU, pictures, snapshots) and the
KV planner. Imports weights (the planner reads model files) and core."""
