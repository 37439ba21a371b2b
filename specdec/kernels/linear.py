"""The one shape of a C++ kernel layer (Q4Linear, Q6Linear, Q8Linear): what the decoder and the
conversions ask of every kernel layer, written once.

A kernel layer is an ``nn.Module`` computing ``y = x Wᵀ + b`` from the tensors named in its
``BUFFERS`` (constructor order, also their serialized names) and an optional float bias; it offers

* ``on_matrix(rows)``: the kernel call itself, contiguous float32 ``[M, K]`` in, ``[M, N]`` out
  (the C++ layer glue calls it directly: module dispatch costs ~3 ms per 1.5B step);
* ``spec()``: its format name, tensors and bias, for the layer loop in C++ (``layer_stack.cpp``);
* ``first_rows(n)``: the layer cut to its first ``n`` outputs, sharing memory (Decoder.head_rows);
  ``select_rows(ids)``: any outputs, copied (a frequency-ranked draft vocabulary);
* ``concat(parts)``: one layer computing ``parts`` side by side (fused q|k|v, gate|up).

Every row keeps its own scales in these formats, so a cut or a concatenation changes no output bit.
:class:`~specdec.kernels.int8.Int8Linear` (fbgemm, not this extension) offers the same three.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch
from torch import nn

from specdec.kernels.build import kernel

L = TypeVar("L", bound="KernelLinear")


def on_rows(x: torch.Tensor, kernel_call: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Run a kernel that takes contiguous float32 ``[M, K]`` on ``x [..., K]``, keeping the leading shape."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.dtype != torch.float32 or not rows.is_contiguous():
        rows = rows.float().contiguous()
    out = kernel_call(rows)
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], out.shape[-1])


def concat_bias(parts: list[Any]) -> torch.Tensor | None:
    """The biases of ``parts`` side by side (zeros for a part without one); None if none has one."""
    biases = [p.bias for p in parts]
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach() if b is not None else torch.zeros(p.out_features) for p, b in zip(parts, biases)])


class KernelLinear(nn.Module):
    """Base of the extension's linear layers: buffers by name, float32 bias, the shared methods."""

    #: the layer's tensors, in constructor order (also its serialized names); rows = output channels
    BUFFERS: tuple[str, ...] = ()
    #: the format's name in the extension's C++ layer loop (layer_stack.cpp: "q4", "q6" or "q8")
    FORMAT = ""

    def __init__(self, tensors: tuple[torch.Tensor, ...], bias: torch.Tensor | None, in_features: int) -> None:
        super().__init__()
        self.out_features, self.in_features = tensors[0].shape[0], in_features
        for name, tensor in zip(self.BUFFERS, tensors):
            self.register_buffer(name, tensor.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)
        self._kernel = kernel()  # built (or loaded) now: a layer that cannot run is never made

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return on_rows(x, self.on_matrix)

    def on_matrix(self, rows: torch.Tensor) -> torch.Tensor:
        """The kernel call itself: contiguous float32 ``[M, K]`` in, ``[M, N]`` out."""
        raise NotImplementedError

    def spec(self) -> tuple[str, list[torch.Tensor], torch.Tensor | None]:
        """``(format, tensors, bias)``: what the C++ layer loop (``LayerStack``) calls the kernel with."""
        return self.FORMAT, [getattr(self, name) for name in self.BUFFERS], self.bias

    def first_rows(self: L, rows: int) -> L:
        """This layer's first ``rows`` outputs, views of its memory (a draft's reduced vocabulary)."""
        bias = None if self.bias is None else self.bias[:rows]
        return type(self)(*(getattr(self, n)[:rows] for n in self.BUFFERS), bias)

    def select_rows(self: L, ids: torch.Tensor) -> L:
        """This layer's outputs ``ids [N]`` in that order, copied (a head's frequency-ranked draft
        vocabulary): every buffer keeps one row per output channel, so a row's result is unchanged."""
        ids = ids.to(getattr(self, self.BUFFERS[0]).device)
        bias = None if self.bias is None else self.bias[ids]
        return type(self)(*(getattr(self, n)[ids] for n in self.BUFFERS), bias)

    @classmethod
    def concat(cls: type[L], parts: list[L]) -> L:
        """One layer computing ``parts`` (all of this class) side by side; the parts become views of
        its rows, so the weights are not held twice."""
        fused = cls(*(torch.cat([getattr(p, n) for p in parts]) for n in cls.BUFFERS), concat_bias(parts))
        start = 0
        for part in parts:
            for n in cls.BUFFERS:
                part._buffers[n] = getattr(fused, n)[start : start + part.out_features]
            start += part.out_features
        return fused
