"""The unit engine's in-pool decode attention (Triton), run by Triton's CPU interpreter, against SDPA over a
gathered copy of the same slots (float32, fresh random data).

The interpreter needs ``TRITON_INTERPRET=1`` before Triton is imported, so the checks run in a child process.
The interpreter's bfloat16 ``tl.dot`` is wrong on the CPU (no bfloat16 in numpy), so bfloat16 is checked on
the GPU (bench/unit_step_kernels.py, tests/gpu/test_fast_unit.py).
"""

from __future__ import annotations

import textwrap

from tests.inference.triton_interpreter import needs_triton, run_interpreted

pytestmark = needs_triton

CHECKS = textwrap.dedent(
    """
    import torch
    from torch.nn import functional as F
    from inference.models.minicpmo.fast.decode_attention import decode_attention, split_of

    def reference(q, keys, values, slots, lengths, kv_len, scale):
        ks, vs = keys[slots, :, :kv_len], values[slots, :, :kv_len]
        visible = torch.arange(kv_len)[None, None, None, :] < lengths[:, None, None, None]
        return F.scaled_dot_product_attention(q, ks, vs, attn_mask=visible, scale=scale)

    torch.manual_seed(5)
    # (rows, kv heads, query heads per kv head, head dim, capacity, kv bucket): GQA as in Qwen3 (4 per head),
    # one query per head, several splits per row and one, rows sharing a slot
    for rows, kv_heads, groups, head_dim, capacity, kv_len in (
        (1, 2, 4, 64, 512, 512), (3, 2, 4, 32, 300, 256), (5, 1, 1, 64, 128, 128), (4, 3, 2, 16, 700, 640)
    ):
        slots_total = 6
        keys = torch.randn(slots_total, kv_heads, capacity, head_dim)
        values = torch.randn(slots_total, kv_heads, capacity, head_dim)
        slots = torch.randint(0, slots_total, (rows,))
        slots[-1] = slots[0]
        lengths = torch.randint(1, kv_len + 1, (rows,))
        lengths[-1] = kv_len
        lengths[0] = 1  # (a single row: 1)
        q = torch.randn(rows, kv_heads, groups, head_dim)
        scale = head_dim ** -0.5
        out = decode_attention(q, keys, values, slots, lengths, kv_len, scale)
        ref = reference(q, keys, values, slots, lengths, kv_len, scale)
        assert out.shape == q.shape and out.dtype == q.dtype and not out.isnan().any()
        err = float((out - ref).norm() / ref.norm())
        assert err < 1e-5, (rows, kv_heads, groups, head_dim, kv_len, err)
        # keys past a row's length are never read: poisoning them changes nothing (row 0 sees one key)
        poisoned_k, poisoned_v = keys.clone(), values.clone()
        poisoned_k[slots[0], :, 1:] = float("nan")
        poisoned_v[slots[0], :, 1:] = float("nan")
        alone = decode_attention(q[:1], keys, values, slots[:1], lengths[:1], kv_len, scale)
        assert torch.equal(decode_attention(q[:1], poisoned_k, poisoned_v, slots[:1], lengths[:1], kv_len, scale), alone)
    assert split_of(1, 8, 1024) == 64 and split_of(16, 8, 4096) > 64  # one row spreads over the GPU
    print("ok")
    """
)


def test_decode_attention_matches_sdpa_in_the_interpreter():
    run_interpreted(CHECKS)
