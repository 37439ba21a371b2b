"""The int8 mode's AVX-512 VNNI GEMM (kernels/int8_gemm*.cpp) behind ``Int8Linear``: bit-exact against
an integer reference computed by torch, batch-invariant (a row alone == the same row in any chunk,
across the kernel's 6-row tiles, its 64-output panels and its 256-row passes), the packed format
round-trips exactly, and the kernel choice (``SPECDEC_INT8_KERNEL``) is explicit. On CPUs with AMX the
same panels run on AMX tiles from 2 rows on (kernels/int8_gemm_amx.cpp): bit-identical to VNNI.

Tests of the kernel itself skip on CPUs without AVX-512 VNNI (fbgemm runs the int8 mode there), the
AMX tests on CPUs without AMX-INT8.
"""

from __future__ import annotations

import pytest
import torch

from specdec.kernels import int8 as int8_module
from specdec.kernels.int8 import Int8Linear, _pack_panels, _unpack_panels, int8_kernel


def vnni_or_skip():
    if int8_kernel() != "vnni":
        pytest.skip("this CPU or build runs fbgemm for int8 (no AVX-512 VNNI)")
    module = int8_module._vnni_module()
    assert module is not None
    return module


@pytest.fixture
def amx():
    """The extension with AMX on from one row (restored after); skips where this CPU has no AMX."""
    module = vnni_or_skip()
    default = module.int8_amx_min_rows()
    if not default:
        pytest.skip("no AMX-INT8 on this CPU (or the OS did not grant this process its tile state)")
    module.set_int8_amx_min_rows(1)
    yield module
    module.set_int8_amx_min_rows(default)


def reference(x: torch.Tensor, layer: Int8Linear) -> torch.Tensor:
    """What the kernel computes, in torch: per-row symmetric int8 activations (127 levels), exact
    integer dot products, then (sum × row scale) × weight scale + bias, in that order."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    codes = torch.round(x * inverse).to(torch.int64)
    sums = codes @ layer.qweight.to(torch.int64).T
    out = (sums.float() * (amax / 127.0)) * layer.scales
    return out if layer.bias is None else out + layer.bias


@pytest.mark.parametrize("outputs,inputs", [(100, 64), (256, 1536), (130, 896)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_the_integer_reference_bit_for_bit(outputs, inputs, with_bias):
    vnni_or_skip()
    torch.manual_seed(outputs + inputs)
    layer = Int8Linear.from_float(torch.randn(outputs, inputs) * 0.05, torch.randn(outputs) if with_bias else None)
    assert isinstance(layer._packed, torch.Tensor), "on a VNNI CPU the layer holds the kernel's panels"
    for rows in (1, 5, 6, 7, 13):
        x = torch.randn(rows, inputs)
        x[0, 3] = 40.0  # an outlier channel, as LLM activations have
        assert torch.equal(layer(x), reference(x, layer)), f"{rows} rows"


def test_a_row_is_bit_identical_alone_and_in_any_chunk():
    """300 rows cross the 6-row tiles, a partial tile and the kernel's 256-row passes."""
    vnni_or_skip()
    torch.manual_seed(1)
    layer = Int8Linear.from_float(torch.randn(200, 128) * 0.05, torch.randn(200))
    x = torch.randn(300, 128) * torch.linspace(0.1, 10, 300)[:, None]
    x[7] = 0.0  # an all-zero row: scale 0, output = bias
    chunk = layer(x)
    alone = torch.cat([layer(x[i:i + 1]) for i in range(300)])
    assert torch.equal(chunk, alone)
    assert torch.equal(chunk[7], layer.bias.data)
    for start, size in ((0, 1), (5, 2), (250, 50), (1, 299)):
        assert torch.equal(layer(x[start:start + size]), chunk[start:start + size])


def test_panels_round_trip_exactly():
    """Runs everywhere: the packed format is plain torch."""
    torch.manual_seed(2)
    weights = torch.randint(-127, 128, (130, 96), dtype=torch.int8)
    packed = _pack_panels(weights)
    assert packed.shape == (3, 24, 64, 4) and packed.dtype == torch.uint8
    assert torch.equal(_unpack_panels(packed, 130), weights)
    # one 64-byte row of a panel: 4 inputs of each of 16 outputs, stored as w + 128
    assert int(packed[0, 0, 5, 2]) == int(weights[5, 2]) + 128


def test_error_against_float32_is_below_fbgemms():
    """8-bit activations (nothing saturates in vpdpbusd) against fbgemm's 7: half the error here
    (0.057 vs 0.113 relative, with four outlier channels)."""
    vnni_or_skip()
    torch.manual_seed(3)
    weight = torch.randn(512, 1536) * 0.02
    x = torch.randn(32, 1536)
    x[:, :4] *= 30.0
    exact = x @ weight.T
    vnni = Int8Linear.from_float(weight)
    fbgemm = Int8Linear.from_float(weight)
    fbgemm._packed = int8_module._prepack_fbgemm(fbgemm.qweight, fbgemm.scales)
    error = lambda out: ((out - exact).norm() / exact.norm()).item()  # noqa: E731
    assert error(vnni(x)) < 0.7 * error(fbgemm(x))


def test_kernel_choice_is_explicit(monkeypatch):
    int8_kernel.cache_clear()
    try:
        monkeypatch.setenv("SPECDEC_INT8_KERNEL", "fbgemm")
        assert int8_kernel() == "fbgemm"
        layer = Int8Linear.from_float(torch.randn(64, 64))
        assert not isinstance(layer._packed, torch.Tensor)
        int8_kernel.cache_clear()
        monkeypatch.setenv("SPECDEC_INT8_KERNEL", "cuda")
        with pytest.raises(ValueError, match="SPECDEC_INT8_KERNEL='cuda'"):
            int8_kernel()
    finally:
        int8_kernel.cache_clear()


def test_wrong_shapes_get_a_clear_error():
    module = vnni_or_skip()
    packed = _pack_panels(torch.zeros(64, 64, dtype=torch.int8))
    scales = torch.ones(64)
    with pytest.raises(RuntimeError, match="packed weights"):
        module.int8_gemm(torch.zeros(2, 128), packed, scales, None, 64)
    with pytest.raises(RuntimeError, match="weight scales"):
        module.int8_gemm(torch.zeros(2, 64), packed, torch.ones(63), None, 64)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        module.int8_gemm(torch.zeros(2, 60), packed, scales, None, 64)


@pytest.mark.parametrize("outputs,inputs", [(100, 64), (130, 80), (64, 96), (40, 112), (256, 1536), (70, 8960 // 4 + 16)])
def test_amx_gives_the_vnni_kernels_bits(amx, outputs, inputs):
    """Every input size class (a K that ends with 16, 32 or 48 inputs past a 64-input tile), rows
    across the 16-row tiles and the 256-row passes: AMX == VNNI == the integer reference."""
    torch.manual_seed(outputs * inputs)
    layer = Int8Linear.from_float(torch.randn(outputs, inputs) * 0.05, torch.randn(outputs))
    x = torch.randn(300, inputs) * torch.linspace(0.1, 10, 300)[:, None]
    x[4] = 0.0
    for rows in (1, 2, 15, 16, 17, 33, 300):
        on_amx = layer(x[:rows])
        amx.set_int8_amx_min_rows(0)
        on_vnni = layer(x[:rows])
        amx.set_int8_amx_min_rows(1)
        assert torch.equal(on_amx, on_vnni), f"{rows} rows"
        assert torch.equal(on_amx, reference(x[:rows], layer)), f"{rows} rows"


def test_the_amx_threshold_can_be_set_and_is_checked(amx):
    amx.set_int8_amx_min_rows(0)
    assert amx.int8_amx_min_rows() == 0
    with pytest.raises(RuntimeError, match=">= 0"):
        amx.set_int8_amx_min_rows(-1)


def test_the_amx_environment_switch(amx, monkeypatch):
    """``SPECDEC_INT8_AMX_ROWS``: read when the extension is first used; 0 turns AMX off, anything but a
    number of rows is refused by name."""
    try:
        monkeypatch.setenv("SPECDEC_INT8_AMX_ROWS", "two")
        int8_module._vnni_module.cache_clear()
        with pytest.raises(ValueError, match="SPECDEC_INT8_AMX_ROWS='two'"):
            int8_module._vnni_module()
        monkeypatch.setenv("SPECDEC_INT8_AMX_ROWS", "0")
        int8_module._vnni_module.cache_clear()
        assert int8_module.amx_from_rows() == 0
        assert int8_module.kernels_note(["int8"]) == ", int8 on avx512-vnni"
        monkeypatch.setenv("SPECDEC_INT8_AMX_ROWS", "4")
        int8_module._vnni_module.cache_clear()
        assert int8_module.kernels_note(["int8"]) == ", int8 on avx512-vnni (AMX from 4 rows)"
    finally:
        monkeypatch.delenv("SPECDEC_INT8_AMX_ROWS")
        int8_module._vnni_module.cache_clear()


def test_the_default_amx_threshold_is_two_rows():
    """A decode step (one row) streams weights, where VNNI was faster; from two rows AMX."""
    module = vnni_or_skip()
    assert module.int8_amx_min_rows() in (0, 2)
