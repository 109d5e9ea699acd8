"""GPU fast path of the lockstep (Moshi / PersonaPlex) engine.

- ``model.FastLM``: row-batched forward over a ``MoshiLM``'s weights (fused kernels via ``ops``).
- ``kv.SlotKV``: per-slot temporal KV rings, bf16 or fp8 e4m3 with per-vector scales.
- ``step.FastLockstep``: per-slot token ring + the graph-capturable row step (``gen.LockstepGen`` semantics).
- ``graphs.GraphedLockstep``: one CUDA graph per batch bucket, all captured at warm-up.
- ``codec.GraphedMimi``: batched, graphed Mimi encode / decode over all slots.
- ``tuning``: per-bucket attention launch tuning and the fused-GEMV self-check, run before capture.
- ``session``: prefill / live helpers and the prefill-passes-per-tick budget.
- ``ops`` / ``triton_kernels``: each fused kernel and its plain-torch twin (the CPU path).
"""
