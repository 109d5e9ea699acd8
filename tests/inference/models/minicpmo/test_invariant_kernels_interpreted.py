"""The row-invariant kernels and their wiring, run by Triton's CPU interpreter (float32, tiny shapes).

On CUDA the eager modules and the fast path both reduce through ``inference/models/minicpmo/invariant``; the
GPU tests check the bits in bfloat16 at the real shapes. Here, where CI runs, the same code paths run in the
interpreter: each kernel against torch (closeness) and against itself alone vs batched (bits), then the LLM
and the audio encoder with ``use_row_invariant_kernels`` swapped in, eager against the fast path's padded,
batched feeds with another session beside them. That last comparison is to float32's last bits, not exact:
on a CPU torch's elementwise cos and exp (RoPE, SiLU, GELU) round by SIMD lane, so a value computed at
another offset of a longer tensor can differ by an ulp; on a GPU they do not, and the GPU tests compare bits
(``tests/gpu/test_unit_bf16_equality.py``). The interpreter needs ``TRITON_INTERPRET=1`` before
Triton is imported, so the checks run in a child process.
"""

from __future__ import annotations

import textwrap

from tests.inference.triton_interpreter import needs_triton, run_interpreted

pytestmark = needs_triton

KERNELS = textwrap.dedent(
    """
    import torch
    from torch.nn import functional as F
    from inference.models.minicpmo.invariant import kernels as K

    torch.manual_seed(0)
    # the pieces as programs of their own and in one program's loop; a bias; ragged edges
    for M, N, Kd in ((1, 70, 1100), (5, 64, 512), (33, 300, 96), (3, 4200, 600)):
        x, w, b = torch.randn(M, Kd), torch.randn(N, Kd), torch.randn(N)
        out = K.linear(x, w, b)
        ref = F.linear(x, w, b)
        assert (out - ref).abs().max() < 1e-4 * ref.abs().max(), (M, N, Kd)
        assert torch.equal(K.linear(x[:1], w, b), out[:1])
    x = torch.randn(3, 5, 96)
    heads = x[..., :64].reshape(3, 5, 4, 16)  # per-head norms on a column slice of a fused projection
    w = torch.randn(16)
    ref = w * (heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert (K.rms_norm(heads, w, 1e-6) - ref).abs().max() < 1e-4
    x, w, b = torch.randn(7, 40), torch.randn(40), torch.randn(40)
    assert (K.layer_norm(x, w, b, 1e-5) - F.layer_norm(x, (40,), w, b, 1e-5)).abs().max() < 1e-4
    # attention over a pool, grouped queries, causal and not, against SDPA; alone with a longer bucket: the same bits
    R, Hkv, G, T, hd = 3, 2, 2, 5, 16
    keys, values = torch.randn(4, Hkv, 700, hd), torch.randn(4, Hkv, 700, hd)
    slots, starts = torch.tensor([2, 0, 3]), torch.tensor([0, 300, 520])
    q = torch.randn(R, Hkv * G, T, hd)
    for causal in (True, False):
        out = K.attention(q, keys, values, slots, starts, 640, hd ** -0.5, causal=causal)
        for r in range(R):
            L = int(starts[r]) + T
            ks = keys[slots[r], :, :L].repeat_interleave(G, 0)
            vs = values[slots[r], :, :L].repeat_interleave(G, 0)
            seen = torch.arange(L)[None, :] <= (starts[r] + torch.arange(T))[:, None]
            ref = F.scaled_dot_product_attention(q[r], ks, vs, attn_mask=seen if causal else None)
            assert (out[r].transpose(0, 1) - ref).abs().max() < 1e-4, (causal, r)
        alone = K.attention(q[1:2], keys, values, slots[1:2], starts[1:2], 1024, hd ** -0.5, causal=causal)
        assert torch.equal(alone, out[1:2])
    # partials are stored and read only where a query row sees keys (row 0 sees 1 of the 4 slices, padding rows
    # none): scratch that starts as NaN must give the same bits, so nothing unstored is ever read
    empty = torch.empty
    torch.empty = lambda *a, **k: empty(*a, **k).fill_(float("nan"))
    try:
        for causal in (True, False):
            poisoned = K.attention(q, keys, values, slots, starts, 1024, hd ** -0.5, causal=causal)
            torch.empty = lambda *a, **k: empty(*a, **k).zero_()
            clean = K.attention(q, keys, values, slots, starts, 1024, hd ** -0.5, causal=causal)
            torch.empty = lambda *a, **k: empty(*a, **k).fill_(float("nan"))
            assert torch.equal(poisoned, clean), causal
            assert not poisoned.isnan().any()
    finally:
        torch.empty = empty
    print("ok")
    """
)

WIRING = textwrap.dedent(
    """
    import json
    import numpy as np
    import torch
    from torch.nn import functional as F
    from inference.models.minicpmo.audio_encoder import AudioStreamState
    from inference.models.minicpmo.config import MiniCPMOConfig
    from inference.models.minicpmo.fast.audio import FastAudio
    from inference.models.minicpmo.fast.llm import FastLLM
    from inference.models.minicpmo.invariant.modules import use_row_invariant_kernels
    from inference.models.minicpmo.loading import build_parts

    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    config = json.load(open("tests/data/minicpmo45/config.json"))
    config["vocab_size"] = 512  # the interpreter runs one program per 64 logits
    parts = build_parts(MiniCPMOConfig.from_dict(config))
    for _, module in parts.modules().values():
        module.eval()
    llm, D = parts.llm, config["hidden_size"]
    prompt, other = torch.randn(7, D) * 0.5, torch.randn(4, D) * 0.5
    torch_cache = llm.new_cache()
    torch_hidden = llm.feed(torch_cache, prompt)  # before the swap: transformers' modules on torch's kernels
    rng = np.random.default_rng(0)
    units = [rng.standard_normal(16000).astype(np.float32) * 0.1 for _ in range(2)]
    torch_audio = parts.audio.embed_unit(AudioStreamState(), units[0])[0]

    def close(a, b):
        return float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())

    use_row_invariant_kernels(parts)

    def torch_kernel(*args, **kwargs):
        raise AssertionError("a torch reduction ran after the swap")

    # from here on neither path may reach torch's GEMM, norms or attention
    F.linear = F.layer_norm = F.rms_norm = F.scaled_dot_product_attention = torch_kernel
    cache = llm.new_cache()
    hidden = llm.feed(cache, prompt)
    assert (hidden - torch_hidden).abs().max() < 1e-4  # the kernels compute what torch does
    step = llm.feed(cache, llm.embed_ids([5]))
    fast = FastLLM(llm, num_slots=3, capacity=512, max_rows=4, invariant=True)
    mine, neighbour = fast.new_cache(), fast.new_cache()
    fast.feed_many([neighbour], [torch.randn(3, D)])
    h, logits = fast.feed_many([mine, neighbour], [prompt, other])  # padded to 16 positions, two rows
    assert close(h[0], hidden[-1]) and close(logits[0], llm.logits(hidden[-1]))
    h, logits = fast.feed_tokens([neighbour, mine], [9, 5])
    assert close(h[1], step[-1]) and close(logits[1], llm.logits(step[-1]))
    assert int(logits[1].argmax()) == int(llm.logits(step[-1]).argmax())

    eager_state = AudioStreamState()
    eager = [parts.audio.embed_unit(eager_state, u)[0] for u in units]
    assert (eager[0] - torch_audio).abs().max() < 1e-4
    encoder = FastAudio(parts.audio, num_slots=3, max_rows=4, invariant=True)
    states = [encoder.new_state(), encoder.new_state()]
    for u, unit in enumerate(units):
        out = encoder.embed_units(states, [unit, rng.standard_normal(16000).astype(np.float32) * 0.1])
        assert close(out[0], eager[u]), u
    print("ok")
    """
)


def test_kernels_match_torch_and_their_rows_alone_in_the_interpreter():
    run_interpreted(KERNELS)


def test_swapped_eager_modules_and_the_fast_path_agree_in_the_interpreter():
    run_interpreted(WIRING)
