"""``GraphedMimi``'s per-prefix graphs on CUDA: a tick replays the prefix that holds its highest live slot, and what
the graph gives equals the eager step over the same rows; rows past the prefix never move. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from inference.models.moshi.config import read_checkpoint_dir  # noqa: E402
from inference.models.moshi.fast.codec import GraphedMimi  # noqa: E402
from inference.models.moshi.mimi import per_row_tensors  # noqa: E402
from inference.models.moshi.mimi_config import MimiConfig  # noqa: E402
from inference.models.moshi.mimi_loading import load_mimi  # noqa: E402
from tests.inference.models.moshi_fast.tiny_pack import DATA  # noqa: E402

SLOTS = 40


def test_each_prefix_graph_equals_the_eager_step_over_its_rows():
    info = read_checkpoint_dir(DATA / "ckpt")
    codec = load_mimi(info.mimi_weights, MimiConfig.from_dict(info.mimi_config)).to("cuda").eval()
    graphed = GraphedMimi(codec, SLOTS, prefixes=(8, 16))
    graphed.capture()
    assert graphed.graphed and sorted(graphed._encode_graphs) == [8, 16, SLOTS]
    eager = GraphedMimi(codec, SLOTS, prefixes=(8, 16))  # never captured: the same prefixes, eagerly
    fresh = {path: t[16:].clone() for path, t in per_row_tensors(graphed.state)}
    g = torch.Generator(device="cuda").manual_seed(7)
    for frame in range(6):
        live = torch.tensor([0, 3, 6] if frame < 3 else [0, 3, 6, 12], device="cuda")  # slot 12 joins
        highest = int(live.max())
        if frame == 3:
            graphed.reset_slot(12)
            eager.reset_slot(12)
        pcm = torch.randn(len(live), 1, graphed.frame, device="cuda", generator=g) * 0.1
        codes = graphed.encode(pcm, live, highest).clone()
        assert torch.equal(codes, eager.encode(pcm, live, highest)), f"frame {frame}: codes"
        out = graphed.decode(codes, live, highest).clone()
        torch.testing.assert_close(out, eager.decode(codes, live, highest), rtol=0, atol=1e-5)
    after = dict(per_row_tensors(graphed.state))
    assert all(torch.equal(after[path][16:], rows) for path, rows in fresh.items()), "rows past 16 stay fresh"
