"""The unit engine's fast path: static KV pools, decode steps batched across sessions and CUDA-graphed."""
