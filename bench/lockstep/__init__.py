"""Pieces of the lockstep GPU benchmark (``bench/lockstep_gpu.py`` is the entry point).

- ``common``: timing statistics, logging, results file.
- ``reference``: moshi 0.2.13 built on the GPU, its timing and its measured capacity.
- ``fast``: the fast path driven by the bench's own loop over the graphs (step timings, graph == eager).
- ``codec``: the batched Mimi, and whole ticks of that bare loop (encode -> step -> decode).
- ``kv_format``: fp8 against bf16 KV on the same weights (divergence, agreement, text-logit KL).
- ``serving``: the serving path itself: ``LockstepEngine`` + ``EngineWorker`` with N sessions in process.
"""
