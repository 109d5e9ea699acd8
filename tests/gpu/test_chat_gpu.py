"""Chat mode on a GPU: the fast runner's reply (static KV pool, graphed one-token steps) is the eager runner's.

Skipped without CUDA (CI). float32, TF32 off, tiny checkpoint: a conversation with an image, history and an
audio clip gets the same reply text through ``FastDuplexRunner`` (the engine's runner on CUDA) as through
``DuplexRunner``, while a duplex call holds another slot of the same pools.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from inference.contracts import ChatMessage  # noqa: E402
from inference.models.minicpmo.audio_encoder import UNIT_SAMPLES  # noqa: E402
from inference.models.minicpmo.chat import ChatReply  # noqa: E402
from inference.models.minicpmo.duplex import DuplexRunner  # noqa: E402
from inference.models.minicpmo.fast.runner import FastDuplexRunner  # noqa: E402
from inference.models.minicpmo.fill import make_checkpoint  # noqa: E402
from inference.models.minicpmo.loading import load_model  # noqa: E402
from inference.models.minicpmo.vocoder import SilentVocoder  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "minicpmo45"


def png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray((np.arange(48 * 64 * 3).reshape(48, 64, 3) % 253).astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_fast_runner_chat_reply_matches_eager(tmp_path):
    torch.set_grad_enabled(False)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    parts = load_model(make_checkpoint(tmp_path, data_dir=DATA, seed=1234), device="cuda", dtype=torch.float32)
    fast = FastDuplexRunner(parts, num_slots=3)
    assert fast.capture(max_kv=512) > 0
    call = fast.new_session()  # a duplex call on another slot meanwhile
    fast.prepare(call, "Streaming Omni Conversation.", None)
    fast.prefill(call, np.zeros(UNIT_SAMPLES, np.float32))
    fast.generate(call, force_listen=True)
    tone = (0.3 * np.sin(np.arange(12_000) / 10) * 32767).astype("<i2").tobytes()
    messages = (
        ChatMessage("user", "What is in this picture?", image=png()),
        ChatMessage("assistant", "A pattern."),
        ChatMessage("user", "And this sound?", audio=tone, audio_rate=16_000),
    )

    def reply(runner) -> list[str]:
        return [p.text for p in ChatReply(runner, SilentVocoder(), messages, 40, "You are helpful.", None).pieces()]

    eager = reply(DuplexRunner(parts))
    graphed = reply(fast)
    print(f"chat reply on cuda: {''.join(eager)!r}")
    assert graphed == eager and "".join(eager).strip()
    assert reply(fast) == eager  # the pools gave the first reply's slot back
