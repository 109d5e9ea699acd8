"""`random_mimi_state_dict`: complete, deterministic from its seed, codebooks shaped like trained ones."""

from __future__ import annotations

import torch

from inference.models.moshi.mimi import MimiCodec
from inference.models.moshi.mimi_config import MimiConfig
from inference.models.moshi.mimi_loading import random_mimi_state_dict


def test_same_seed_same_tensors_other_seed_other_tensors(tiny_config):
    a, b, c = (random_mimi_state_dict(tiny_config, seed) for seed in (1, 1, 2))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    drawn = [k for k in a if not k.endswith("._initialized")]  # the flags are constant ones
    assert all(not torch.equal(a[k], c[k]) for k in drawn)


def test_every_tensor_is_present_and_loads_strictly(tiny_config):
    state = random_mimi_state_dict(tiny_config, 3)
    codec = MimiCodec(tiny_config)
    codec.load_state_dict(state, strict=True)  # raises on any missing or extra key
    assert set(state) == set(codec.state_dict())
    assert all(torch.isfinite(v).all() for v in state.values())


def test_codebooks_are_initialised_with_varied_usage(tiny_config):
    state = random_mimi_state_dict(tiny_config, 4)
    books = [k.removesuffix(".cluster_usage") for k in state if k.endswith(".cluster_usage")]
    assert len(books) == tiny_config.quantizer.n_q
    for book in books:
        usage = state[f"{book}.cluster_usage"]
        assert torch.equal(state[f"{book}._initialized"], torch.ones(1))
        assert (usage > 0).all() and usage.std() > 0.1
        assert state[f"{book}.embedding_sum"].shape == (tiny_config.quantizer.bins, tiny_config.quantizer.dimension)


def test_loaded_codebooks_are_sums_divided_by_usage(tiny_config):
    state = random_mimi_state_dict(tiny_config, 5)
    codec = MimiCodec(tiny_config)
    codec.load_state_dict(state)
    book = codec.quantizer.rvq_rest.vq.layers[2]._codebook
    prefix = "quantizer.rvq_rest.vq.layers.2._codebook"
    expected = state[f"{prefix}.embedding_sum"] / state[f"{prefix}.cluster_usage"][:, None]
    torch.testing.assert_close(book.embedding, expected)


def test_full_size_state_dict_is_generated_for_the_published_config():
    config = MimiConfig.kyutai_default()
    state = random_mimi_state_dict(config, 0)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in MimiCodec(config).state_dict().items()}
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
