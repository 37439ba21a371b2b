"""The decoder layers of a quantized model with their glue in C++ (``layer_ops.cpp``).

Per layer: two norms (each folding in the pending residual add), one attention call (RoPE, KV-cache
write, row-wise attention), four or five kernel calls and silu·up — instead of ~40 ATen ops, each
paying Python and dispatcher overhead (~12 ms per 1.5B step). Same math as the decoder's own layer
forward, row by row, so a token's result is bit-identical alone or inside a verification chunk.

A :class:`CppLayers` is what a decoder's ``layer_runner`` slot holds (``Decoder.set_layer_runner``):
it reads the layers through their declared attributes (norm weights, projections, ``fused_qkv`` /
``fused_gate_up``) once, when it is made.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specdec.kernels.build import available, kernel
from specdec.kernels.int8 import Int8Linear
from specdec.kernels.linear import KernelLinear
from specdec.kernels.prompt_attention import choose_prompt_attention

#: a projection's call: contiguous float32 ``[M, K]`` in, ``[M, N]`` out
Projection = Callable[[torch.Tensor], torch.Tensor]
#: rows per pass of a layer's MLP (as layer_stack.cpp's kMlpRows, and why): a long prompt's gate|up
#: output in one piece (174 MB a layer at 2 430 rows of the 1.5B) came from the OS fresh on every
#: allocation — page faults were a third of the prompt pass; the kernels are row by row, so no bit changes
MLP_ROWS = 256


class CppLayers:
    """Runs a decoder's layers through the extension; the signature of ``Decoder._run_layers``
    (the decoder argument is that same decoder). A snapshot of the layers' modules: made after the
    conversion and after the projections are fused (see ``Decoder.set_layer_runner``)."""

    def __init__(self, decoder: nn.Module, prompt_passes: bool = False) -> None:
        """``prompt_passes``: the decoder is a prompt twin (:func:`use_for_prompt_passes`), its
        attention the extension's ``prompt_attention``."""
        self.ops = kernel()
        self.eps = decoder.config.rms_norm_eps
        self.prompt_passes = prompt_passes
        self.attention = self.ops.prompt_attention if prompt_passes else self.ops.attention
        #: per layer: input norm weight, q|k|v call, heads, kv heads, o call, post norm weight,
        #: gate|up call, down call — the kernels called directly (module dispatch: ~3 ms per 1.5B step)
        self.plan: list[tuple] = []
        for layer in decoder.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.plan.append((
                layer.input_layernorm.weight, _projections(attn.fused_qkv, attn, attn.FUSABLE_PROJECTIONS),
                attn.num_heads, attn.num_kv_heads, _direct(attn.o_proj), layer.post_attention_layernorm.weight,
                _projections(mlp.fused_gate_up, mlp, mlp.FUSABLE_PROJECTIONS), _direct(mlp.down_proj),
            ))
        #: the same loop in C++ (layer_stack.cpp, same calls, same bits) when every projection is one of
        #: the extension's kernels (int8 layers on the VNNI kernel included); None where one is not
        #: (fbgemm's int8 layers): the loop above runs
        self.stack = _layer_stack(decoder, self.ops, prompt_passes)

    def __call__(self, decoder: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Any,
                 start: int, mask: torch.Tensor | None, run: Sequence[int]) -> torch.Tensor:
        """One request: :meth:`ragged` with a single segment (the same calls on the same tensors)."""
        return self.ragged(x, [(0, x.shape[0], cos, sin, cache, start, mask)], run)

    def ragged(self, x: torch.Tensor, segments: Sequence[tuple], run: Sequence[int]) -> torch.Tensor:
        """Several requests' new tokens in one pass: ``x [ΣT_i, hidden]`` holds them back to back;
        ``segments`` gives each request's ``(first row, end row, cos, sin, cache, start, mask)``.

        Norms and projections run once over all rows (they are row by row: a row's bits do not
        depend on the others — int32 accumulation, per-token activation scales); attention runs per
        request against its own cache. So each request's rows are bit-identical to running it alone,
        and the weights are read once for all of them — what makes a decode step of 8 requests cost
        little more than one."""
        if self.stack is not None:
            return self.stack.run(x, [(a, b, cos, sin, cache.k, cache.v, start, None if mask is None else mask.contiguous())
                                      for a, b, cos, sin, cache, start, mask in segments], list(run))
        ops, eps, plan = self.ops, self.eps, self.plan
        segments = [(a, b, cos, sin, cache, start, None if mask is None else mask.contiguous())
                     for a, b, cos, sin, cache, start, mask in segments]
        pending = None  # the last sub-layer's output, added to the residual stream by the next norm
        for index in run:
            input_norm, qkv_proj, heads, kv_heads, o_proj, post_norm, gate_up_proj, down_proj = plan[index]
            qkv = qkv_proj(ops.rms_norm(x, pending, input_norm, eps))
            outs = [self.attention(qkv[a:b], cos, sin, cache.k[index], cache.v[index], start, heads, kv_heads, mask)
                    for a, b, cos, sin, cache, start, mask in segments]
            out = outs[0] if len(outs) == 1 else torch.cat(outs)
            hidden = ops.rms_norm(x, o_proj(out), post_norm, eps)
            parts = [_mlp(gate_up_proj, down_proj, hidden[first:first + MLP_ROWS])
                     for first in range(0, hidden.shape[0], MLP_ROWS)]
            pending = parts[0] if len(parts) == 1 else torch.cat(parts)
        return x if pending is None else x.add_(pending)


def use_layer_ops(decoder: nn.Module, required: bool = True) -> None:
    """Run ``decoder``'s layers through :class:`CppLayers`. ``required=False`` (int8, whose own
    kernels need no compiler): keep the Python layers where the extension cannot be built or the
    sizes do not suit it — still batch-invariant, only slower."""
    cfg = decoder.config
    if required:
        kernel()  # raises, saying why
    elif not available():
        return
    if cfg.hidden_size % 8 == 0 and cfg.head_dim % 8 == 0:
        runner = CppLayers(decoder)
        decoder.set_layer_runner(runner, runner.ragged)


def _mlp(gate_up_proj: Projection, down_proj: Projection, hidden: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up_proj(hidden).chunk(2, dim=-1)
    return down_proj(F.silu(gate).mul_(up))


def use_for_prompt_passes(decoder: nn.Module) -> None:
    """Mark ``decoder`` as a prompt twin (``TorchBackend.use_for_prompts``: it runs prompt passes only,
    never a decode or verification row): its attention becomes ``prompt_attention``, whose causal rows
    multiply on AMX-BF16 tiles where the CPU has them (~3x the float32 kernel on a 2-core Xeon), or with
    AVX-512 BF16's vdpbf16ps where that measures faster here (:mod:`specdec.kernels.prompt_attention`). Exact for
    decoding as the twin's other weight format is: plain and speculative decoding read the same prompt
    cache, and a row's bits do not depend on how the prompt was split into passes. A decoder without
    the C++ layers keeps its own."""
    if isinstance(decoder.layer_runner, CppLayers) and not decoder.layer_runner.prompt_passes:
        runner = CppLayers(decoder, prompt_passes=True)
        decoder.set_layer_runner(runner, runner.ragged)
        choose_prompt_attention(runner.ops, decoder.config.head_dim)


def bf16_prompt_attention(decoder: nn.Module) -> str:
    """How ``decoder``'s prompt passes multiply in attention here, for execution lines: ``"amx-bf16"`` or
    ``"avx512-bf16"`` (a prompt twin's layers in C++, heads a multiple of 32 wide, a CPU where that kind
    runs and was chosen), else ``""``."""
    runner = decoder.layer_runner
    if not (isinstance(runner, CppLayers) and runner.prompt_passes and decoder.config.head_dim % 32 == 0):
        return ""
    kind = str(runner.ops.prompt_attention_kind())
    return "" if kind == "float32" else kind


def _direct(layer: nn.Module) -> Projection:
    """``layer``'s kernel call without module dispatch or reshaping (other layers: the module)."""
    return getattr(layer, "on_matrix", layer)


def _parts(fused: nn.Module | None, module: nn.Module, names: tuple[str, ...]) -> list[nn.Module]:
    """The layers computing ``names`` side by side: the fused one, or each of them."""
    return [fused] if fused is not None else [getattr(module, name) for name in names]


def _projections(fused: nn.Module | None, module: nn.Module, names: tuple[str, ...]) -> Projection:
    """The side-by-side outputs of ``names``: one call when they were fused."""
    parts = [_direct(part) for part in _parts(fused, module, names)]
    return parts[0] if len(parts) == 1 else lambda x: torch.cat([part(x) for part in parts], dim=-1)


def _layer_stack(decoder: nn.Module, ops: Any, prompt_passes: bool) -> Any | None:
    """The extension's ``LayerStack`` over ``decoder``'s layers (the loop of :meth:`CppLayers.ragged`
    in one C++ call: ~1.4 ms less Python per 0.5B draft step), or None when a projection is not one
    of the extension's kernel layers (an int8 layer is where it runs the VNNI kernel)."""
    stack = ops.LayerStack(decoder.config.rms_norm_eps, prompt_passes)
    for layer in decoder.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = _parts(attn.fused_qkv, attn, attn.FUSABLE_PROJECTIONS)
        gate_up = _parts(mlp.fused_gate_up, mlp, mlp.FUSABLE_PROJECTIONS)
        if not all(isinstance(p, KernelLinear) or (isinstance(p, Int8Linear) and p.spec() is not None)
                   for p in (*qkv, *gate_up, attn.o_proj, mlp.down_proj)):
            return None
        stack.add_layer(layer.input_layernorm.weight, [p.spec() for p in qkv], attn.num_heads, attn.num_kv_heads,
                        attn.o_proj.spec(), layer.post_attention_layernorm.weight, [p.spec() for p in gate_up],
                        mlp.down_proj.spec())
    return stack
