"""4-bit weights × int8 activations, batch-invariant: the fastest exact CPU target path.

Why: a decode step streams every weight once, so bytes per weight set the speed. int8 weights
(models/quant.py) cost 1 byte; this format ~0.59 (4-bit codes, 8-bit scales and mins per 32 weights,
two floats per 256) — the format of llama.cpp's Q4_K, so a GGUF's Q4_K tensors run with their *own*
values instead of a requantized copy. Measured here for the 1.5B target's linear layers (2 threads):
32 ms per single-token step vs 53–65 ms for int8 (``benchmarks/int8_kernels.py``).

Why our own C++ kernel (``q4_kernel.cpp``): speculative verification needs a token's logits to be
bit-identical alone and inside a chunk. The kernel quantizes each activation row with its own scale
and runs the same instruction sequence for every (row, output) pair whatever the number of rows, so
that holds by construction (``tests/test_q4.py`` checks it with ``torch.equal``). The price: its
cost grows ~11 ms per extra row (AVX2 has no int8 dot instruction), where int8's is nearly flat —
int8 stays the better target for long verification chunks.

The kernel is compiled once per machine (~40 s, g++ and ninja) into ``~/.cache/specdec/ext``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import SpecdecError

#: the extension's sources: the linear kernels (and the module definition), the rest of a layer
_SOURCES = (Path(__file__).with_name("q4_kernel.cpp"), Path(__file__).with_name("layer_ops.cpp"))
_HEADERS = (Path(__file__).with_name("simd.h"),)
#: blocks of 256 inputs (8 groups of 32 sharing two float scales), as in Q4_K; a layer whose input
#: size is not a multiple of 256 ends in a partial block (sc/mn zero-padded to 8 groups)
BLOCK = 256
#: the kernel's unit: a pair of groups of 32 (one 32-byte load of 4-bit codes)
PAIR = 64
#: bytes of one Q4_K block in a GGUF file: f16 d, f16 dmin, 12 bytes of packed 6-bit scales/mins, 128 of codes
Q4K_BLOCK_BYTES = 144
#: a Q4Linear's tensors, in constructor order (also its serialized names)
Q4_BUFFERS = ("qs", "sc", "mn", "d", "dmin")


@functools.lru_cache(maxsize=1)
def kernel() -> Any:
    """Build (first call on a machine) or load the compiled kernel module."""
    if not sys.platform.startswith("linux") or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        raise SpecdecError("int4 execution needs an x86 CPU with AVX2 on Linux; use --quantize int8")
    from torch.utils.cpp_extension import load

    sources = b"".join(p.read_bytes() for p in _SOURCES + _HEADERS)
    source_hash = hashlib.sha1(sources + torch.__version__.encode()).hexdigest()[:12]
    home = Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec")
    build_dir = home / "ext" / f"q4-{source_hash}"
    build_dir.mkdir(parents=True, exist_ok=True)
    # ninja (a dependency) is installed beside this interpreter; make sure the build finds it
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    try:
        return load(
            name="specdec_q4",
            sources=[str(p) for p in _SOURCES],
            extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
        )
    except (RuntimeError, OSError, ImportError) as exc:
        raise SpecdecError(
            f"could not build the int4 kernel (needs g++ and ninja): {exc}; use --quantize int8"
        ) from exc


class Q4Linear(nn.Module):
    """``y = x Wᵀ + b`` with ``W[n, k] = d[n, b]·sc[n, g]·q − dmin[n, b]·mn[n, g]`` (q ∈ 0..15,
    g = k / 32, b = k / 256) and per-token int8 activations; float32 in and out. ``sc``/``mn`` hold
    whole blocks of 8 groups (zero-padded when the input size is not a multiple of 256)."""

    BUFFERS = Q4_BUFFERS

    def __init__(self, qs: torch.Tensor, sc: torch.Tensor, mn: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = qs.shape[0], qs.shape[1] * 2
        for name, tensor in zip(Q4_BUFFERS, (qs, sc, mn, d, dmin)):
            self.register_buffer(name, tensor.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)
        self._kernel = kernel()

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return on_rows(x, self.on_matrix)

    def on_matrix(self, rows: torch.Tensor) -> torch.Tensor:
        """The kernel call itself: contiguous float32 ``[M, K]`` in, ``[M, N]`` out."""
        return self._kernel.q4_linear(rows, self.qs, self.sc, self.mn, self.d, self.dmin, self.bias)

    def first_rows(self, rows: int) -> "Q4Linear":
        return first_rows(self, rows)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, 4-bit x int8 per-token"


def on_rows(x: torch.Tensor, kernel_call: Any) -> torch.Tensor:
    """Run a kernel that takes contiguous float32 ``[M, K]`` on ``x [..., K]``, keeping the leading shape."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.dtype != torch.float32 or not rows.is_contiguous():
        rows = rows.float().contiguous()
    out = kernel_call(rows)
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], out.shape[-1])


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
    (q4_kernel.cpp: vector v holds codes 32g + 4v + t of every group g) — its own inverse (an 8×8
    transpose of 4-code units); a partial last block stays in order."""
    rows, cols = codes.shape
    full = cols // BLOCK * BLOCK
    units = codes[:, :full].reshape(rows, full // BLOCK, 8, 8, 4).transpose(2, 3).reshape(rows, full)
    return torch.cat([units, codes[:, full:]], dim=1)


class Q8Linear(nn.Module):
    """int8 weights (symmetric, per output row) × per-token int8 activations through the same C++
    kernel file: the int4 mode's layers a GGUF stores as Q8_0 or float (Q6_K ones have their own
    :class:`~specdec.models.q6.Q6Linear`), and every non-Q4_K layer when there is no GGUF. Also batch-invariant; unlike fbgemm's int8 (models/
    quant.py) it has no per-call setup, which dominated small layers (0.6 ms per v projection)."""

    BUFFERS = ("w8", "w8_scales")

    def __init__(self, w8: torch.Tensor, w8_scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = w8.shape
        self.register_buffer("w8", w8.contiguous())
        self.register_buffer("w8_scales", w8_scales.float().contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)
        self._kernel = kernel()

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Q8Linear":
        weight = weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        return cls(torch.clamp(torch.round(weight / scales[:, None]), -127, 127).to(torch.int8), scales, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return on_rows(x, self.on_matrix)

    def on_matrix(self, rows: torch.Tensor) -> torch.Tensor:
        """The kernel call itself: contiguous float32 ``[M, K]`` in, ``[M, N]`` out."""
        return self._kernel.q8_linear(rows, self.w8, self.w8_scales, self.bias)

    def first_rows(self, rows: int) -> "Q8Linear":
        return first_rows(self, rows)


def concat(parts: list[nn.Module]) -> nn.Module:
    """One Q4Linear (or Q8Linear) computing ``parts`` side by side: rows keep their own scales, so
    every output is bit-identical to its part's."""
    biases = [p.bias for p in parts]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else torch.zeros(p.out_features) for p, b in zip(parts, biases)])
    cls = type(parts[0])
    names = cls.BUFFERS
    fused = cls(*(torch.cat([getattr(p, n) for p in parts]) for n in names), bias)
    start = 0
    for part in parts:  # the parts become views of the fused rows: no second copy of the weights
        for n in names:
            part._buffers[n] = getattr(fused, n)[start : start + part.out_features]
        start += part.out_features
    return fused


def first_rows(layer: nn.Module, rows: int) -> nn.Module:
    """A kernel layer (Q4Linear, Q6Linear, Q8Linear) computing only ``layer``'s first ``rows``
    outputs, sharing its memory (a draft's reduced vocabulary: see Decoder.head_rows)."""
    names = type(layer).BUFFERS
    bias = None if layer.bias is None else layer.bias[:rows]
    return type(layer)(*(getattr(layer, n)[:rows] for n in names), bias)


def quantize_decoder_q4(decoder: nn.Module, q4k_blocks: dict[str, np.ndarray] | None = None,
                        low_bit: set[str] | frozenset[str] = frozenset(),
                        q6k_blocks: dict[str, np.ndarray] | None = None, every_layer: bool = False) -> nn.Module:
    """The mode ``int4``, in place: linear layers in the 4-bit format, attention row-wise, so the
    model is batch-invariant (exact speculation) like the int8 one.

    Which layers: from a GGUF, its Q4_K tensors with their own values, and the tensors it stores in
    fewer than 6 bits (``low_bit``: Q5_0… — most of the 0.5B draft) rounded to 4; its Q6_K tensors
    (the LM head and half of the v/down projections of a Q4_K_M file) with their own values too
    (:class:`~specdec.models.q6.Q6Linear`); Q8_0/F16 ones become int8 per channel
    (:class:`Q8Linear`), keeping their precision. Without GGUF blocks
    (HF directories, tests) every layer but the LM head is rounded to 4 bits; the head stays int8
    (llama.cpp's convention too: logits are the most quantization-sensitive output).
    ``every_layer`` (mode ``int4-all``, drafts): everything not already Q4_K is rounded to 4 bits —
    for the 0.5B draft the int8 LM head was over a third of a step's bytes."""
    from specdec.models.q6 import Q6Linear
    from specdec.models.quant import fuse_projections, set_batch_invariant

    for name, module in list(decoder.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            key = f"{name}.{child_name}.weight" if name else f"{child_name}.weight"
            if q4k_blocks is not None and key in q4k_blocks:
                new: nn.Module = Q4Linear.from_q4k(q4k_blocks[key], child.bias)
            elif every_layer or (q4k_blocks is None and key != "lm_head.weight") or key in low_bit:
                new = Q4Linear.from_float(child.weight, child.bias)
            elif q6k_blocks is not None and key in q6k_blocks:
                new = Q6Linear.from_q6k(q6k_blocks[key], child.bias)
            else:
                new = Q8Linear.from_float(child.weight, child.bias)
            setattr(module, child_name, new)
    set_batch_invariant(decoder, True)
    decoder.quantization = "int4"
    use_layer_ops(decoder)
    return fuse_projections(decoder)


def use_layer_ops(decoder: nn.Module, required: bool = True) -> None:
    """Run ``decoder``'s layers through :func:`run_layers`. ``required=False`` (int8, whose own
    kernels need no compiler): keep the Python layers where the extension cannot be built or the
    sizes do not suit it — still batch-invariant, only slower."""
    cfg = decoder.config
    try:
        kernel()
    except SpecdecError:
        if required:
            raise
        return
    if cfg.hidden_size % 8 == 0 and cfg.head_dim % 8 == 0:
        decoder.set_layer_runner(run_layers)


def run_layers(decoder: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Any, start: int,
               mask: torch.Tensor | None, run: Any) -> torch.Tensor:
    """The decoder layers ``run`` of an int4 (or int8) model, glue in C++ (layer_ops.cpp): per layer
    two norms (each folding in the pending residual add), one attention call, four or five kernel calls
    and silu·up — instead of ~40 ATen ops. Same math as ``DecoderLayer.forward``, row by row. The
    kernels are called directly (see :func:`layer_plan`): module dispatch cost ~3 ms per 1.5B step."""
    ops = kernel()
    eps = decoder.config.rms_norm_eps
    mask = None if mask is None else mask.contiguous()
    plan = layer_plan(decoder)
    pending = None  # the last sub-layer's output, added to the residual stream by the next norm
    for index in run:
        input_norm, qkv_proj, heads, kv_heads, o_proj, post_norm, gate_up_proj, down_proj = plan[index]
        qkv = qkv_proj(ops.rms_norm(x, pending, input_norm, eps))
        out = ops.attention(qkv, cos, sin, cache.k[index], cache.v[index], start, heads, kv_heads, mask)
        gate, up = gate_up_proj(ops.rms_norm(x, o_proj(out), post_norm, eps)).chunk(2, dim=-1)
        pending = down_proj(F.silu(gate).mul_(up))
    return x if pending is None else x.add_(pending)


def layer_plan(decoder: nn.Module) -> list[tuple]:
    """Per layer, what :func:`run_layers` calls — norm weights and the kernel calls of its projections
    (``[M, K]`` contiguous float32 in, as run_layers always passes) — built once per decoder."""
    plan = decoder.__dict__.get("_layer_plan")
    if plan is None:
        plan = []
        for layer in decoder.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            plan.append((layer.input_layernorm.weight, _projections(attn, "fused_qkv", ("q_proj", "k_proj", "v_proj")),
                         attn.num_heads, attn.num_kv_heads, _direct(attn.o_proj), layer.post_attention_layernorm.weight,
                         _projections(mlp, "fused_gate_up", ("gate_proj", "up_proj")), _direct(mlp.down_proj)))
        decoder.__dict__["_layer_plan"] = plan
    return plan


def _direct(layer: nn.Module) -> Any:
    """``layer``'s kernel call without module dispatch or reshaping (other layers: the module)."""
    return getattr(layer, "on_matrix", layer)


def _projections(module: nn.Module, fused_name: str, names: tuple[str, ...]) -> Any:
    """The side-by-side outputs of ``names``: one call when fuse_projections could fuse them."""
    fused = getattr(module, fused_name)
    if fused is not None:
        return _direct(fused)
    parts = [_direct(getattr(module, name)) for name in names]
    return lambda x: torch.cat([part(x) for part in parts], dim=-1)
