"""Batch-invariant int8 linear layers: the CPU fast path that makes exact speculation pay.

Why int8 × int8: on a CPU a decode step is bound by weight bandwidth, and an int8 GEMM with int32
accumulation costs about the same for 1 to 5 tokens (measured here for the 1.5B target's linear
stack, 2 threads: 67 ms for T=1, 69 ms for T=5, 84 ms for T=8; fp32: 277 ms for T=1, ~700 ms for
T=5). Verifying γ drafted tokens is then nearly free — the premise of speculative decoding.

Why per-token activation scales: a dynamic-quantization kernel picks one activation scale for the
whole chunk, so a token's output changes with its neighbours and speculative output could differ
from plain output. Here each row is divided by its own max |x| before quantization (fixed scale
1/127, zero point 128) and multiplied back after, so a row's result is bit-identical alone or in a
chunk. Integer accumulation is exact, so nothing else depends on the chunk size.

The kernel (fbgemm's ``linear_with_input_q_dq_qweight_dq_output_fp32`` through ``torch.ops``) is
wrapped by :class:`Int8Linear` so it can be swapped without touching the model code.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

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


def _prepack(qweight: torch.Tensor, scales: torch.Tensor) -> object:
    """int8 weights [out, in] with per-output-channel scales → the kernel's packed format."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao quantized tensors print deprecation notices in 2.13
        zero_points = torch.zeros(qweight.shape[0], dtype=torch.long)
        quantized = torch._make_per_channel_quantized_tensor(qweight, scales.double(), zero_points, 0)
        return torch.ops.quantized.linear_prepack(quantized, None)


class Int8Linear(nn.Module):
    """``y = x Wᵀ + b`` with int8 weights (symmetric, per output channel) and int8 activations
    (per token), int32 accumulation, float32 output. Holds no float copy of W."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features = qweight.shape[1]
        self.out_features = qweight.shape[0]
        # kept (int8 + fp32 scales) for serialization; the packed copy is what the kernel reads
        self.register_buffer("qweight", qweight.contiguous(), persistent=True)
        self.register_buffer("scales", scales.float().contiguous(), persistent=True)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)
        self._packed = _prepack(self.qweight, self.scales)

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
        if self._packed is None:  # released by fuse(); a direct call still works
            self._packed = _prepack(self.qweight, self.scales)
        x2 = x.reshape(-1, shape[-1])
        if x2.dtype != torch.float32:
            x2 = x2.float()
        row_scale = x2.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-30)
        out = _LINEAR_Q_DQ(x2 / row_scale, INT8_SCALE, INT8_ZERO_POINT, self._packed).mul_(row_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out if len(shape) == 2 else out.reshape(*shape[:-1], self.out_features)

    def first_rows(self, rows: int) -> "Int8Linear":
        """This layer's first ``rows`` outputs (a draft's reduced vocabulary: Decoder.head_rows), in
        its own prepacked copy: fbgemm reads packed weights."""
        bias = None if self.bias is None else self.bias[:rows]
        return Int8Linear(self.qweight[:rows], self.scales[:rows], bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-token"


def quantize_decoder(decoder: nn.Module) -> nn.Module:
    """Swap every ``nn.Linear`` (LM head included; a tied head gets its own int8 copy while the
    embedding stays float) for :class:`Int8Linear`, in place, and switch attention to its
    batch-invariant path. Float weights of the linears are freed."""
    if not int8_available():
        raise RuntimeError("this torch build has no fbgemm/x86 quantized engine: int8 is unavailable")
    for name, module in list(decoder.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Int8Linear.from_float(child.weight, child.bias))
    set_batch_invariant(decoder, True)
    decoder.quantization = "int8"
    from specdec.models.q4 import use_layer_ops

    use_layer_ops(decoder, required=False)  # the C++ glue when it builds: ~12 ms less per 1.5B step
    return fuse_projections(decoder)


def fuse(parts: list[Int8Linear]) -> Int8Linear:
    """One Int8Linear computing ``parts`` side by side. Rows (output channels) keep their own weight
    scales and a token keeps its activation scale, so each output is bit-identical to its part's."""
    biases = [p.bias for p in parts]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else torch.zeros(p.out_features) for p, b in zip(parts, biases)])
    fused = Int8Linear(torch.cat([p.qweight for p in parts]), torch.cat([p.scales for p in parts]), bias)
    for part in parts:
        part._packed = None  # the fused copy is what runs; qweight stays for serialization
    return fused


def fuse_projections(decoder: nn.Module) -> nn.Module:
    """q|k|v and gate|up each become one kernel call (int8 or int4 alike): the same input is quantized once and a small
    model's step makes ~3 fewer calls per layer (per-call overhead is a large share of a 0.5B draft's
    step on a CPU). Stored outside the module tree, so state_dict and weight_bytes are unchanged."""
    import os

    if os.environ.get("SPECDEC_NO_FUSE"):  # A/B switch for benchmarks
        return decoder
    from specdec.models.q4 import concat

    for module in decoder.modules():
        names = getattr(module, "FUSABLE_PROJECTIONS", None)  # Attention (q|k|v) and MLP (gate|up)
        if names is None:
            continue
        parts = [getattr(module, n) for n in names]
        if all(isinstance(p, Int8Linear) for p in parts):
            module.set_fused_projections(fuse(parts))
        elif all(hasattr(p, "BUFFERS") for p in parts) and len({type(p) for p in parts}) == 1:
            module.set_fused_projections(concat(parts))  # int4 targets; mixed kinds stay separate calls
    return decoder


def set_batch_invariant(decoder: nn.Module, enabled: bool) -> None:
    for module in decoder.modules():
        if hasattr(module, "row_wise_attention"):
            module.row_wise_attention = enabled


def quantized_state(decoder: nn.Module) -> dict[str, torch.Tensor]:
    """Everything needed to rebuild the quantized decoder (int8 weights, scales, float rest)."""
    state = {k: v.contiguous() for k, v in decoder.state_dict().items() if not k.endswith("_packed")}
    # int4 layers fused into one call are views of the fused rows; safetensors wants owned storage
    return {k: v if v.untyped_storage().nbytes() == v.nbytes else v.clone() for k, v in state.items()}


def load_quantized_state(decoder: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """Inverse of :func:`quantized_state` on a float decoder skeleton (built on the meta device):
    int8 layers (``qweight``/``scales``) and the int4 mode's (Q4Linear, Q6Linear, Q8Linear)."""
    from specdec.models.q4 import Q4Linear, Q8Linear, use_layer_ops
    from specdec.models.q6 import Q6Linear

    kernel_layers = (Q4Linear, Q6Linear, Q8Linear)  # the int4 mode's layers, told apart by their first buffer
    kinds = set()
    for name, module in list(decoder.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                prefix = f"{name}.{child_name}" if name else child_name
                bias = state.get(f"{prefix}.bias")
                kind = next((k for k in kernel_layers if f"{prefix}.{k.BUFFERS[0]}" in state), None)
                if kind is not None:
                    layer: nn.Module = kind(*(state[f"{prefix}.{b}"] for b in kind.BUFFERS), bias)
                else:
                    layer = Int8Linear(state[f"{prefix}.qweight"], state[f"{prefix}.scales"], bias)
                kinds.add(type(layer))
                setattr(module, child_name, layer)
    first_buffers = (".qweight", *(f".{k.BUFFERS[0]}" for k in kernel_layers))
    quantized = {k.rsplit(".", 1)[0] for k in state if k.endswith(first_buffers)}
    rest = {k: v for k, v in state.items() if k.rsplit(".", 1)[0] not in quantized}
    decoder.load_state_dict(rest, strict=False, assign=True)
    set_batch_invariant(decoder, True)
    decoder.quantization = "int4" if kinds & set(kernel_layers) else "int8"
    use_layer_ops(decoder, required=decoder.quantization == "int4")
    return fuse_projections(decoder)
