"""Batch-invariant int8 linear layers: the CPU fast path that makes exact speculation pay.

Why int8 × int8: on a CPU a decode step is bound by weight bandwidth, and an int8 GEMM with int32
accumulation costs about the same for 1 to 5 tokens (measured here for the 1.5B target's linear
stack, 2 threads: 67 ms for T=1, 69 ms for T=5, 84 ms for T=8; fp32: 277 ms for T=1, ~700 ms for
T=5). Verifying γ drafted tokens is then nearly free — the premise of speculative decoding.

Why per-token activation scales: a dynamic-quantization kernel picks one activation scale for the
whole chunk, so a token's output changes with its neighbours and speculative output could differ
from plain output. Here each row is quantized with its own scale (its max |x|), so a row's result is
bit-identical alone or in a chunk. Integer accumulation is exact, so nothing else depends on the
chunk size.

Two kernels; the process picks one (:func:`int8_kernel`) and a layer takes it when its weights are
packed (a layer whose input size is not a multiple of 16 stays on fbgemm):

* ``vnni`` — ours (kernels/int8_gemm_avx512.cpp), on CPUs with AVX-512 VNNI: 1.2–1.27× fbgemm's
  speed on the 1.5B target's layers from 1 to 256 rows, 1.25–1.36× on the whole model's forwards
  (2-core Zen 4 EPYC, interleaved), and 8-bit
  activations (127 levels: vpdpbusd sums in int32, nothing saturates), about half fbgemm's error
  against float32 here.
  Where the CPU has AMX-INT8 (Sapphire Rapids and later) the same panels run on AMX tiles from 2 rows
  on (kernels/int8_gemm_amx.cpp): the same output bits, 1.4× faster at 8 rows and 1.7× at 64 for the
  1.5B target's forwards (:func:`amx_from_rows`; ``SPECDEC_INT8_AMX_ROWS=0`` turns it off).
* ``fbgemm`` — ``linear_with_input_q_dq_qweight_dq_output_fp32`` through ``torch.ops``, everywhere else
  (or with ``SPECDEC_INT8_KERNEL=fbgemm``), with 7-bit activations (see ACT_LEVELS).

Both are batch-invariant; they differ in their last bits, so a process runs one of them for all its
layers (the choice is fixed per process). :class:`Int8Linear` wraps them so the model code does not
see which; it offers the kernel layers' ``first_rows``/``concat`` (kernels/linear.py). Converting a
whole decoder to int8 is kernels/convert.py's ``quantize_decoder``.
"""

from __future__ import annotations

import functools
import os
import warnings
from types import ModuleType

import torch
from torch import nn

from specdec.kernels import build
from specdec.kernels.linear import concat_bias

#: Activations use 7 of the 8 bits (values 1..127 around zero point 64): fbgemm's AVX2 kernel adds
#: pairs of uint8×int8 products in int16 (vpmaddubsw), which saturates for full-range uint8 inputs
#: (measured: 7.5% relative error at 8 bits vs ~1% at 7). This is torch's ``reduce_range``.
ACT_LEVELS = 63
INT8_SCALE = 1.0 / ACT_LEVELS
INT8_ZERO_POINT = 64


#: the fbgemm kernel: static activation scale, per-channel int8 weights, fp32 output
_LINEAR_Q_DQ = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32


def int8_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines or "x86" in torch.backends.quantized.supported_engines


#: outputs per panel of the VNNI kernel's weight format (int8_gemm_avx512.cpp)
PANEL_OUTPUTS = 64


@functools.lru_cache(maxsize=1)
def _vnni_module() -> ModuleType | None:
    """The C++ extension where it builds here and this CPU runs its int8 GEMM, else None."""
    if not build.available():  # also False where the extension cannot run at all (build.unsupported_reason)
        return None
    module = build.kernel()
    if not module.int8_gemm_supported():
        return None
    rows = os.environ.get("SPECDEC_INT8_AMX_ROWS", "").strip()
    if rows:  # AMX from this many rows (0: never); the output bits are the same either way
        if not rows.isdigit():
            raise ValueError(f"SPECDEC_INT8_AMX_ROWS={rows!r}: a number of rows (0: never AMX)")
        module.set_int8_amx_min_rows(int(rows))
    return module


@functools.lru_cache(maxsize=1)
def int8_kernel() -> str:
    """The kernel this process's int8 layers run: ``vnni`` where the CPU has AVX-512 VNNI (and the C++
    extension builds), else ``fbgemm``; ``SPECDEC_INT8_KERNEL=fbgemm|vnni`` chooses (vnni where it
    cannot run is an error). Fixed for the process: the two differ in their last bits."""
    wanted = os.environ.get("SPECDEC_INT8_KERNEL", "").strip().lower()
    if wanted not in ("", "auto", "vnni", "fbgemm"):
        raise ValueError(f"SPECDEC_INT8_KERNEL={wanted!r}: choose vnni, fbgemm or auto")
    if wanted == "fbgemm":
        return "fbgemm"
    if _vnni_module() is not None:
        return "vnni"
    if wanted == "vnni":
        raise RuntimeError("SPECDEC_INT8_KERNEL=vnni: this CPU or build has no AVX-512 VNNI int8 kernel")
    return "fbgemm"


def amx_from_rows() -> int:
    """The rows from which this process's int8 layers run on AMX tiles (int8_gemm_amx.cpp: the VNNI
    kernel's bits, faster from 2 rows on a Xeon with AMX), or 0 where they never do."""
    module = _vnni_module()
    return int(module.int8_amx_min_rows()) if module is not None and int8_kernel() == "vnni" else 0


def kernels_note(modes: list[str]) -> str:
    """``", avx512-vnni kernels, int4 on AMX from 8 rows, int8 on avx512-vnni (AMX from 2 rows)"``: what an execution line says of the C++ kernels
    that run ``modes`` here (the instruction set changes speed, and results files are compared across
    CPUs; int8 names its kernel, ours or fbgemm), or ``""`` when no mode is int4 or int8."""
    notes = []
    if any(mode.startswith("int4") for mode in modes):
        notes.append(f"{build.kernel_path()} kernels")
        q4_amx_rows = int(build.kernel().q4_amx_min_rows())
        if q4_amx_rows:
            notes.append(f"int4 on AMX from {q4_amx_rows} rows")
    if "int8" in modes:  # which int8 kernel: an int8-only run named none (results files compare across CPUs)
        amx_rows = amx_from_rows()
        notes.append(f"int8 on {'avx512-vnni' if int8_kernel() == 'vnni' else 'fbgemm'}"
                     + (f" (AMX from {amx_rows} rows)" if amx_rows else ""))
    return "".join(f", {note}" for note in notes)


def _pack_panels(qweight: torch.Tensor) -> torch.Tensor:
    """int8 ``[N, K]`` → the VNNI kernel's panels ``[ceil(N/64), K/4, 64, 4]`` of uint8 ``w + 128``
    (zero rows pad the last panel)."""
    rows, inputs = qweight.shape
    panels = -(-rows // PANEL_OUTPUTS)
    unsigned = torch.empty(panels * PANEL_OUTPUTS, inputs, dtype=torch.uint8)  # one copy, flipped in place:
    unsigned[:rows] = qweight.view(torch.uint8)                                # a 151k-row head is 233 MB
    unsigned[:rows] ^= 0x80
    unsigned[rows:] = 0x80  # zero weights
    return unsigned.view(panels, PANEL_OUTPUTS, inputs // 4, 4).permute(0, 2, 1, 3).contiguous()


def _unpack_panels(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """Inverse of :func:`_pack_panels`: the int8 ``[rows, K]`` weights, exactly."""
    panels, groups = packed.shape[0], packed.shape[1]
    unsigned = packed.permute(0, 2, 1, 3).reshape(panels * PANEL_OUTPUTS, groups * 4)[:rows]
    return (unsigned ^ 0x80).view(torch.int8).contiguous()


def _unpack(packed: object, rows: int) -> torch.Tensor:
    """The int8 weights a :func:`_prepack` result holds, exactly (both kernels keep them losslessly)."""
    if isinstance(packed, torch.Tensor):
        return _unpack_panels(packed, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized, _ = torch.ops.quantized.linear_unpack(packed)
        return quantized.int_repr()


def _prepack(qweight: torch.Tensor, scales: torch.Tensor) -> object:
    """int8 weights [out, in] with per-output-channel scales → the packed format of this process's
    kernel: the VNNI kernel's panels (a tensor) or fbgemm's opaque packed weights."""
    if int8_kernel() == "vnni" and qweight.shape[1] % 16 == 0:
        return _pack_panels(qweight)
    return _prepack_fbgemm(qweight, scales)


def _prepack_fbgemm(qweight: torch.Tensor, scales: torch.Tensor) -> object:
    """fbgemm's packed weights (per-channel quantized tensor → ``linear_prepack``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao quantized tensors print deprecation notices in 2.13
        zero_points = torch.zeros(qweight.shape[0], dtype=torch.long)
        quantized = torch._make_per_channel_quantized_tensor(qweight, scales.double(), zero_points, 0)
        return torch.ops.quantized.linear_prepack(quantized, None)


class Int8Linear(nn.Module):
    """``y = x Wᵀ + b`` with int8 weights (symmetric, per output channel) and int8 activations
    (per token), int32 accumulation, float32 output. Holds no float copy of W — and no second int8
    copy either: the kernel's packed weights are the only one (``qweight`` unpacks them when the
    weights are serialized or sliced; a 1.5B model's process held 2.2 GB more with both)."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, pack: bool = True) -> None:
        """``pack=False``: keep ``qweight`` as it is until :meth:`pack` (a loader that fuses layers
        first, :meth:`concat`, prepacks each weight once instead of packing, unpacking and packing
        again: fbgemm's prepacking was most of an int8 model's load)."""
        super().__init__()
        self.in_features = qweight.shape[1]
        self.out_features = qweight.shape[0]
        self.register_buffer("scales", scales.float().contiguous(), persistent=True)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)
        #: the int8 weights before packing (pack=False), else None
        self._unpacked: torch.Tensor | None = None if pack else qweight.contiguous()
        self._packed: object | None = _prepack(qweight.contiguous(), self.scales) if pack else None
        # One byte seen as [out, in]: every counter that walks a module's tensors (Decoder.weight_bytes,
        # layer skip's skipped bytes, step_costs' head bytes) counts the int8 weights a forward reads,
        # which live in the opaque packed object; not serialized (``qweight`` is).
        self.register_buffer("weight_extent", torch.zeros(1, dtype=torch.int8).expand(self.out_features, self.in_features),
                             persistent=False)
        #: set by :meth:`concat` on its parts: (the fused layer, this part's first row there)
        self._rows_in: tuple["Int8Linear", int] | None = None

    @property
    def qweight(self) -> torch.Tensor:
        """int8 weights ``[out, in]``, unpacked from the kernel's copy (a new tensor each call)."""
        if self._packed is not None:
            return _unpack(self._packed, self.out_features)
        if self._unpacked is not None:
            return self._unpacked
        assert self._rows_in is not None, "an Int8Linear holds its packed weights or is part of a fused one"
        fused, first = self._rows_in
        return fused.qweight[first:first + self.out_features]

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "qweight"] = self.qweight  # what load_quantized_state rebuilds the layer from

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Int8Linear":
        weight = weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        qweight = torch.clamp(torch.round(weight / scales[:, None]), -127, 127).to(torch.int8)
        return cls(qweight, scales, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A decode step makes ~100 of these calls: every op here costs a few µs of dispatch, so the
        # scale is applied in place and nothing is copied that is already float32 and contiguous.
        shape = x.shape
        if self._packed is None:  # not packed yet, or released by concat(); a direct call still works
            self._packed, self._unpacked = _prepack(self.qweight, self.scales), None
        x2 = x.reshape(-1, shape[-1])
        if x2.dtype != torch.float32:
            x2 = x2.float()
        if isinstance(self._packed, torch.Tensor):  # the VNNI kernel: scales, bias and all in one call
            module = _vnni_module()
            assert module is not None, "VNNI panels are packed only where the kernel runs"
            out = module.int8_gemm(x2.contiguous(), self._packed, self.scales, self.bias, self.out_features)
            return out if len(shape) == 2 else out.reshape(*shape[:-1], self.out_features)
        row_scale = x2.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-30)
        out = _LINEAR_Q_DQ(x2 / row_scale, INT8_SCALE, INT8_ZERO_POINT, self._packed).mul_(row_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out if len(shape) == 2 else out.reshape(*shape[:-1], self.out_features)

    def spec(self) -> tuple[str, list[torch.Tensor], torch.Tensor | None] | None:
        """``("i8", [panels, scales], bias)`` for the C++ layer loop (layer_stack.cpp) where this layer
        runs the VNNI kernel (packs it first), else None: fbgemm's layers run from Python."""
        self.pack()
        if not isinstance(self._packed, torch.Tensor):
            return None
        return "i8", [self._packed, self.scales], self.bias

    def pack(self) -> None:
        """Prepack the weights for the kernel: a no-op when packed, or when part of a fused layer
        (:meth:`concat`: that one holds its rows)."""
        if self._packed is None and self._rows_in is None:
            self._packed, self._unpacked = _prepack(self.qweight, self.scales), None

    def first_rows(self, rows: int) -> "Int8Linear":
        """This layer's first ``rows`` outputs (a draft's reduced vocabulary: Decoder.head_rows), in
        its own packed copy: both kernels read packed weights."""
        bias = None if self.bias is None else self.bias[:rows]
        return Int8Linear(self.qweight[:rows], self.scales[:rows], bias)

    def select_rows(self, ids: torch.Tensor) -> "Int8Linear":
        """This layer's outputs ``ids [N]`` in that order (a head's frequency-ranked draft vocabulary:
        Decoder.head_rows), in its own packed copy; each row keeps its own weight scale, so output j
        is bit-identical to this layer's output ``ids[j]``."""
        ids = ids.to(self.qweight.device)
        return Int8Linear(self.qweight[ids], self.scales[ids], None if self.bias is None else self.bias[ids])

    @classmethod
    def concat(cls, parts: list["Int8Linear"]) -> "Int8Linear":
        """One Int8Linear computing ``parts`` side by side. Rows (output channels) keep their own
        weight scales and a token keeps its activation scale, so each output is bit-identical to its
        part's. The parts release their packed copies and read their rows from the fused layer when
        serialized."""
        fused = cls(torch.cat([p.qweight for p in parts]), torch.cat([p.scales for p in parts]), concat_bias(parts),
                    pack=False)  # packed on first use, or with the others by convert._finish
        first = 0
        for part in parts:
            part._packed, part._unpacked, part._rows_in = None, None, (fused, first)
            first += part.out_features
        return fused

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-token"
