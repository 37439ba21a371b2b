"""6-bit weights × int8 activations, batch-invariant: the int4 mode's precise layers.

Why: a Q4_K_M GGUF stores its most sensitive tensors — the LM head and half of the v/down
projections — as Q6_K (6.56 bits per weight). Re-quantizing them to int8 per channel (the earlier
:class:`~specdec.kernels.q4.Q8Linear` path) cost 1 byte per weight and a third of the 1.5B target's
decode step went to those layers; this format holds Q6_K's own values (no rounding: the same numbers
llama.cpp runs) in ~0.82 bytes, and its kernel (``q6_linear`` in ``linear_kernels.cpp``) needs about half
of int8's vector operations per activation row, which is what a verification chunk adds.
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.errors import SpecdecError
from specdec.kernels.linear import KernelLinear
from specdec.kernels.q4 import BLOCK, pack_codes, unpack_codes

#: bytes of one Q6_K block in a GGUF file: 128 low-nibble bytes, 64 of top bits, 16 int8 scales, f16 d
Q6K_BLOCK_BYTES = 210
#: weights per scale
GROUP = 16


def interleave_q6(codes: torch.Tensor) -> torch.Tensor:
    """Reorder ``[rows, K]`` codes within each block of 256 into the kernel's vector order: vector v
    (0..7), 4-byte unit j (0..7) = the codes 4·(v mod 4) .. + 3 of group 2j + v // 4 (groups of 16), so a
    vpdpbusd lane sums one group's codes — the even groups in vectors 0-3, the odd ones in 4-7, each
    lane pairing with the same lane of the other half as the group scales pair in the float part."""
    rows, cols = codes.shape
    blocks = codes.reshape(rows, cols // BLOCK, 8, 2, 4, 4)  # [.., pair j, half, unit u, code t]: group 2j + half
    return blocks.permute(0, 1, 3, 4, 2, 5).reshape(rows, cols)  # vector v = 4 · half + u, then lane j


def deinterleave_q6(codes: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`interleave_q6`."""
    rows, cols = codes.shape
    return codes.reshape(rows, cols // BLOCK, 2, 4, 8, 4).permute(0, 1, 4, 2, 3, 5).reshape(rows, cols)


class Q6Linear(KernelLinear):
    """``y = x Wᵀ + b`` with ``W[n, k] = d[n, k/256]·sc[n, k/16]·(q − 32)``, q ∈ 0..63, and per-token
    int8 activations; float32 in and out. Codes in the kernel's vector order (``ql`` low 4 bits,
    ``qh`` top 2 bits)."""

    BUFFERS = ("ql", "qh", "sc6", "d6")
    FORMAT = "q6"

    def __init__(self, ql: torch.Tensor, qh: torch.Tensor, sc6: torch.Tensor, d6: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        super().__init__((ql, qh, sc6, d6), bias, in_features=ql.shape[1] * 2)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, d: torch.Tensor,
                   bias: torch.Tensor | None = None) -> "Q6Linear":
        """Natural-order codes ``[rows, K]`` (0..63), int8 ``scales [rows, K/16]``, ``d [rows, K/256]``."""
        rows, cols = codes.shape
        if cols % BLOCK:
            raise SpecdecError(f"6-bit layers need input sizes divisible by {BLOCK}; this one takes {cols}")
        vectors = interleave_q6(codes.to(torch.uint8))
        high = (vectors >> 4).reshape(rows, cols // BLOCK, 2, 4, 32)
        qh = (high[:, :, :, 0] | high[:, :, :, 1] << 2 | high[:, :, :, 2] << 4 | high[:, :, :, 3] << 6)
        return cls(pack_codes(vectors & 0xF), qh.reshape(rows, cols // 4), scales.to(torch.int8),
                   d.float(), bias)

    @classmethod
    def from_q6k(cls, blocks: np.ndarray, bias: torch.Tensor | None = None) -> "Q6Linear":
        """A GGUF Q6_K tensor's raw bytes ``[rows, blocks·210]`` → the same weights, no rounding."""
        rows = blocks.shape[0]
        raw = np.ascontiguousarray(blocks).reshape(rows, -1, Q6K_BLOCK_BYTES)
        low = raw[..., :128].reshape(rows, -1, 2, 64)  # per half block of 128 weights
        high = raw[..., 128:192].reshape(rows, -1, 2, 32)
        codes = np.concatenate([  # ggml's dequantize_row_q6_K, as integers
            (low[..., :32] & 0xF) | ((high & 3) << 4), (low[..., 32:] & 0xF) | (((high >> 2) & 3) << 4),
            (low[..., :32] >> 4) | (((high >> 4) & 3) << 4), (low[..., 32:] >> 4) | (((high >> 6) & 3) << 4),
        ], axis=-1).reshape(rows, -1)
        scales = raw[..., 192:208].copy().view(np.int8).reshape(rows, -1)
        d = raw[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
        return cls.from_codes(torch.from_numpy(codes), torch.from_numpy(scales), torch.from_numpy(d), bias)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Q6Linear":
        """Round-to-nearest into the format (symmetric per 16, int8 scales, a float per 256): tests."""
        weight = weight.detach().float()
        rows, cols = weight.shape
        if cols % BLOCK:
            raise SpecdecError(f"6-bit layers need input sizes divisible by {BLOCK}; this one takes {cols}")
        groups = weight.reshape(rows, cols // GROUP, GROUP)
        step = groups.abs().amax(-1) / 31
        d = (step.reshape(rows, -1, BLOCK // GROUP).amax(-1) / 127).clamp_min(1e-20)
        scales = (step / d.repeat_interleave(BLOCK // GROUP, dim=1)).round().clamp(-127, 127)
        step_q = (scales * d.repeat_interleave(BLOCK // GROUP, dim=1)).clamp_min(1e-20)[..., None]
        codes = (groups / step_q).round().clamp(-32, 31) + 32
        return cls.from_codes(codes.reshape(rows, cols), scales, d, bias)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight matrix this layer computes with (for tests and quality reports)."""
        rows = self.out_features
        vectors = unpack_codes(self.ql).reshape(rows, -1, 8, 32)
        high = self.qh.reshape(rows, -1, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]
        vectors = vectors | ((high & 3) << 4).reshape(rows, -1, 8, 32)
        codes = deinterleave_q6(vectors.reshape(rows, -1)).float() - 32
        step = self.d6.repeat_interleave(BLOCK // GROUP, dim=1) * self.sc6.float()
        return (codes.reshape(rows, -1, GROUP) * step[..., None]).reshape(rows, self.in_features)

    def on_matrix(self, rows: torch.Tensor) -> torch.Tensor:
        """The kernel call itself: contiguous float32 ``[M, K]`` in, ``[M, N]`` out."""
        return self._kernel.q6_linear(rows, self.ql, self.qh, self.sc6, self.d6, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, 6-bit (Q6_K) x int8 per-token"
