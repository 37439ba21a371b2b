"""6-bit layers of the int4 mode (kernels/q6.py): a GGUF's Q6_K weights reproduced exactly, accuracy
against float, and bit-identical rows alone vs inside a verification chunk."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from tests.model_fixtures import require_cpu_kernels

require_cpu_kernels()

from specdec.kernels.q6 import Q6K_BLOCK_BYTES, Q6Linear


def random_q6k(rows: int, blocks: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, blocks, Q6K_BLOCK_BYTES), dtype=np.uint8)
    raw[..., 208:210] = rng.uniform(1e-4, 1e-3, size=(rows, blocks, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, blocks * Q6K_BLOCK_BYTES)


def test_q6k_blocks_reproduce_the_gguf_weights_exactly_and_run_close_to_them():
    import gguf

    rows, blocks = 10, 3
    raw = random_q6k(rows, blocks)
    layer = Q6Linear.from_q6k(raw)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q6_K).reshape(rows, blocks * 256)
    ref = torch.from_numpy(np.asarray(ref, dtype=np.float32))
    assert torch.equal(layer.dequantized(), ref)
    x = torch.randn(4, blocks * 256, generator=torch.Generator().manual_seed(1))
    exact = torch.nn.functional.linear(x, ref)
    # the only approximation left is the per-token int8 activations: ≤ 2% per row
    assert ((layer(x) - exact).norm(dim=-1) / exact.norm(dim=-1)).max() < 0.02


def test_q6_from_float_close_to_float():
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 512, generator=gen) * 0.02, torch.randn(96, generator=gen)
    x = torch.randn(5, 512, generator=gen)
    ref = torch.nn.functional.linear(x, weight, bias)
    out = Q6Linear.from_float(weight, bias)(x)
    assert ((out - ref).norm(dim=-1) / ref.norm(dim=-1)).max() < 0.03  # 6-bit weights, 8-bit activations


@pytest.mark.parametrize("rows", [2, 4, 5, 8, 9, 17])
def test_q6_rows_bit_identical_alone_and_in_a_chunk(rows):
    gen = torch.Generator().manual_seed(rows)
    layer = Q6Linear.from_q6k(random_q6k(40, 3, seed=rows))
    x = torch.randn(rows, 768, generator=gen)
    x[1] *= 50  # an outlier row must not change its neighbours (per-token scales)
    chunk = layer(x)
    for i in range(rows):
        assert torch.equal(chunk[i], layer(x[i : i + 1])[0]), f"row {i} of {rows}"


def test_input_size_must_be_whole_blocks():
    from specdec.errors import SpecdecError

    with pytest.raises(SpecdecError, match="divisible by 256"):
        Q6Linear.from_float(torch.randn(8, 320))
