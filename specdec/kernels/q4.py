"""4-bit weights × int8 activations, batch-invariant: the fastest exact CPU target path.

Why: a decode step streams every weight once, so bytes per weight set the speed. int8 weights
(kernels/int8.py) cost 1 byte; this format ~0.59 (4-bit codes, 8-bit scales and mins per 32 weights,
two floats per 256) — the format of llama.cpp's Q4_K, so a GGUF's Q4_K tensors run with their *own*
values instead of a requantized copy. Measured here for the 1.5B target's linear layers (2 threads):
32 ms per single-token step vs 53–65 ms for int8 (``benchmarks/int8_kernels.py``).

Why our own C++ kernel (``linear_kernels.cpp``): speculative verification needs a token's logits to be
bit-identical alone and inside a chunk. The kernel quantizes each activation row with its own scale
and runs the same instruction sequence for every (row, output) pair whatever the number of rows, so
that holds by construction (``tests/test_q4.py`` checks it with ``torch.equal``). The price: its
cost grows ~11 ms per extra row on AVX2 (no int8 dot instruction), where int8's is nearly flat —
int8 stays the better target for long verification chunks there. Where the CPU has AVX-512 VNNI the
same kernel runs ``vpdpbusd`` for chunks (``linear_kernels_avx512.cpp``, same output bits): ~8 ms
per extra row of the 1.5B on a 2-core Zen 4.

The kernel is compiled once per machine (~40 s, g++ and ninja: see kernels/build.py). Converting a
whole decoder to this mode is kernels/convert.py's ``quantize_decoder_q4``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from specdec.errors import SpecdecError
from specdec.kernels.build import q4_amx_rows_from_env
from specdec.kernels.linear import KernelLinear

#: blocks of 256 inputs (8 groups of 32 sharing two float scales), as in Q4_K; a layer whose input
#: size is not a multiple of 256 ends in a partial block (sc/mn zero-padded to 8 groups)
BLOCK = 256
#: the kernel's unit: a pair of groups of 32 (one 32-byte load of 4-bit codes)
PAIR = 64
#: bytes of one Q4_K block in a GGUF file: f16 d, f16 dmin, 12 bytes of packed 6-bit scales/mins, 128 of codes
Q4K_BLOCK_BYTES = 144
#: a Q4Linear's tensors, in constructor order (also its serialized names)
Q4_BUFFERS = ("qs", "sc", "mn", "d", "dmin")


class Q4Linear(KernelLinear):
    """``y = x Wᵀ + b`` with ``W[n, k] = d[n, b]·sc[n, g]·q − dmin[n, b]·mn[n, g]`` (q ∈ 0..15,
    g = k / 32, b = k / 256) and per-token int8 activations; float32 in and out. ``sc``/``mn`` hold
    whole blocks of 8 groups (zero-padded when the input size is not a multiple of 256)."""

    BUFFERS = Q4_BUFFERS
    FORMAT = "q4"

    def __init__(self, qs: torch.Tensor, sc: torch.Tensor, mn: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        super().__init__((qs, sc, mn, d, dmin), bias, in_features=qs.shape[1] * 2)
        self._amx_copy: torch.Tensor | None = None

    def amx_copy(self) -> torch.Tensor | None:
        """The layer's copy for the AMX path (``linear_kernels_amx.cpp``), made on first use; None where it
        does not run (no AMX here, ``SPECDEC_Q4_AMX_ROWS=0``, or inputs not whole blocks of 256).

        Why a copy: AMX multiplies a panel of 16 weight rows at once, and the stored layout keeps each row's
        codes together (what the one-row decode kernel streams); regrouping them per panel on every call cost
        as much as the products. The copy holds the same codes and scales (~0.59 bytes per weight again)."""
        if self._amx_copy is None and self.in_features % BLOCK == 0 and amx_copies_wanted(self._kernel):
            self._amx_copy = self._kernel.q4_amx_repack(self.qs, self.sc, self.mn, self.d, self.dmin)
        return self._amx_copy

    def spec(self) -> tuple[str, list[torch.Tensor], torch.Tensor | None]:
        """As :meth:`KernelLinear.spec`, with the AMX copy as a sixth tensor where there is one."""
        amx = self.amx_copy()
        tensors = [getattr(self, name) for name in self.BUFFERS] + ([amx] if amx is not None else [])
        return self.FORMAT, tensors, self.bias

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Q4Linear":
        """Round-to-nearest into the format (min/max per group of 32, scales and mins to 8 bits per
        block): for weights that do not come as Q4_K already."""
        weight = weight.detach().float()
        rows, cols = weight.shape
        check_shape(cols)
        groups = weight.reshape(rows, cols // 32, 32)
        low, high = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
        step, offset = (high - low) / 15, -low  # w ≈ step·q − offset
        padding = -(cols // 32) % 8  # a partial last block: zero step and offset (sc = mn = 0)
        step, offset = F.pad(step, (0, padding)), F.pad(offset, (0, padding))
        step_b, offset_b = step.reshape(rows, -1, 8), offset.reshape(rows, -1, 8)
        d = (step_b.amax(-1) / 255).clamp_min(1e-20)
        dmin = (offset_b.amax(-1) / 127).clamp_min(1e-20)
        sc = (step_b / d[..., None]).round().clamp(0, 255)
        mn = (offset_b / dmin[..., None]).round().clamp(0, 127)
        step_q = (sc * d[..., None]).reshape(rows, -1, 1)[:, : cols // 32]
        offset_q = (mn * dmin[..., None]).reshape(rows, -1, 1)[:, : cols // 32]
        codes = ((groups + offset_q) / step_q.clamp_min(1e-20)).round().clamp(0, 15).to(torch.uint8)
        return cls(pack_codes(interleave_blocks(codes.reshape(rows, cols))), sc.reshape(rows, -1).to(torch.uint8),
                   mn.reshape(rows, -1).to(torch.int8), d, dmin, bias)

    @classmethod
    def from_q4k(cls, blocks: np.ndarray, bias: torch.Tensor | None = None) -> "Q4Linear":
        """A GGUF Q4_K tensor's raw bytes ``[rows, blocks·144]`` → the same weights, no rounding."""
        rows = blocks.shape[0]
        raw = np.ascontiguousarray(blocks).reshape(rows, -1, Q4K_BLOCK_BYTES)
        d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        dmin = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        packed = raw[..., 4:16].astype(np.uint8)  # 8 six-bit scales and 8 six-bit mins in 12 bytes
        sc = np.empty((*packed.shape[:2], 8), np.uint8)
        mn = np.empty_like(sc)
        sc[..., :4], mn[..., :4] = packed[..., 0:4] & 63, packed[..., 4:8] & 63
        sc[..., 4:] = (packed[..., 8:12] & 0xF) | ((packed[..., 0:4] >> 6) << 4)
        mn[..., 4:] = (packed[..., 8:12] >> 4) | ((packed[..., 4:8] >> 6) << 4)
        qs = torch.from_numpy(raw[..., 16:].reshape(rows, -1).copy())  # Q4_K's nibble layout
        return cls(pack_codes(interleave_blocks(unpack_codes(qs))), torch.from_numpy(sc.reshape(rows, -1)),
                   torch.from_numpy(mn.reshape(rows, -1).astype(np.int8)), torch.from_numpy(d), torch.from_numpy(dmin), bias)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight matrix this layer computes with (for tests and quality reports)."""
        rows = self.out_features
        codes = interleave_blocks(unpack_codes(self.qs)).reshape(rows, -1, 32).float()
        groups = self.in_features // 32
        step = (self.d.repeat_interleave(8, dim=1) * self.sc.float())[:, :groups, None]
        offset = (self.dmin.repeat_interleave(8, dim=1) * self.mn.float())[:, :groups, None]
        return (codes * step - offset).reshape(rows, self.in_features)

    def on_matrix(self, rows: torch.Tensor) -> torch.Tensor:
        """The kernel call itself: contiguous float32 ``[M, K]`` in, ``[M, N]`` out."""
        return self._kernel.q4_linear(rows, self.qs, self.sc, self.mn, self.d, self.dmin, self.bias, self.amx_copy())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, 4-bit x int8 per-token"


def amx_copies_wanted(module: Any) -> bool:
    """Whether 4-bit layers make their AMX copy here: the CPU and the OS run AMX tiles and
    ``SPECDEC_Q4_AMX_ROWS`` is not 0 (turning the path off also spares the memory)."""
    return bool(module.amx_q4_ready()) and q4_amx_rows_from_env() != 0


def check_shape(in_features: int) -> None:
    if in_features % PAIR:
        raise SpecdecError(f"int4 needs input sizes divisible by {PAIR}; this layer takes {in_features}")


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """``[rows, K]`` codes 0..15 → ``[rows, K/2]`` bytes: codes 64p+j (low nibble) and 64p+32+j (high)."""
    rows, cols = codes.shape
    pairs = codes.reshape(rows, cols // 64, 2, 32)
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(rows, cols // 2).contiguous()


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_codes`."""
    rows = packed.shape[0]
    low, high = packed & 0xF, packed >> 4
    return torch.stack([low.reshape(rows, -1, 32), high.reshape(rows, -1, 32)], dim=2).reshape(rows, -1)


def interleave_blocks(codes: torch.Tensor) -> torch.Tensor:
    """Reorder ``[rows, K]`` codes within each whole block of 256 into the kernel's vector order
    (linear_kernels.cpp: vector v holds codes 32g + 4v + t of every group g) — its own inverse (an 8×8
    transpose of 4-code units); a partial last block stays in order."""
    rows, cols = codes.shape
    full = cols // BLOCK * BLOCK
    units = codes[:, :full].reshape(rows, full // BLOCK, 8, 8, 4).transpose(2, 3).reshape(rows, full)
    return torch.cat([units, codes[:, full:]], dim=1)


class Q8Linear(KernelLinear):
    """int8 weights (symmetric, per output row) × per-token int8 activations through the same C++
    kernel file: the int4 mode's layers a GGUF stores as Q8_0 or float (Q6_K ones have their own
    :class:`~specdec.kernels.q6.Q6Linear`), and every non-Q4_K layer when there is no GGUF. Also
    batch-invariant; unlike fbgemm's int8 (kernels/int8.py) it has no per-call setup, which dominated
    small layers (0.6 ms per v projection)."""

    BUFFERS = ("w8", "w8_scales")
    FORMAT = "q8"

    def __init__(self, w8: torch.Tensor, w8_scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__((w8, w8_scales.float()), bias, in_features=w8.shape[1])

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Q8Linear":
        weight = weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        return cls(torch.clamp(torch.round(weight / scales[:, None]), -127, 127).to(torch.int8), scales, bias)

    def on_matrix(self, rows: torch.Tensor) -> torch.Tensor:
        """The kernel call itself: contiguous float32 ``[M, K]`` in, ``[M, N]`` out."""
        return self._kernel.q8_linear(rows, self.w8, self.w8_scales, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 x int8 per-token"
