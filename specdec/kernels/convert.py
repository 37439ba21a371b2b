"""Whole-decoder conversions to the quantized CPU modes, and their serialized form.

A decoder here is any ``nn.Module`` with the decoder's declared interface (specdec/models/
transformer.py), used by duck typing so this package imports nothing of ``specdec.models``:
``config`` (``rms_norm_eps``, ``hidden_size``, ``head_dim``), ``model.layers`` (each with
``input_layernorm``, ``self_attn``, ``post_attention_layernorm``, ``mlp``), ``quantization``,
``set_layer_runner(runner)``; modules with ``FUSABLE_PROJECTIONS`` and
``set_fused_projections(module)`` (attention: q|k|v, MLP: gate|up); modules with a
``row_wise_attention`` flag. Its linear layers are ``nn.Linear`` children, swapped in place.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import nn

from specdec.kernels.embedding import BlockEmbedding
from specdec.kernels.int8 import Int8Linear, int8_available
from specdec.kernels.layers import use_layer_ops
from specdec.kernels.q4 import Q4Linear, Q8Linear
from specdec.kernels.q6 import Q6Linear

#: the int4 mode's layers, told apart in a serialized state by their first buffer
INT4_MODE_LAYERS = (Q4Linear, Q6Linear, Q8Linear)


def quantize_decoder(decoder: nn.Module, fuse: bool = True) -> nn.Module:
    """The mode ``int8``, in place: every ``nn.Linear`` (LM head included; a tied head gets its own
    int8 copy while the embedding stays float) becomes an :class:`Int8Linear`, attention runs
    row-wise (batch-invariant), and the layers' glue runs in C++ where the extension builds.
    ``fuse=False``: q|k|v and gate|up stay separate calls (an A/B switch for benchmarks; the output
    is the same bits either way). Float weights of the linears are freed."""
    if not int8_available():
        raise RuntimeError("this torch build has no fbgemm/x86 quantized engine: int8 is unavailable")
    for module in list(decoder.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Int8Linear.from_float(child.weight, child.bias))
    decoder.quantization = "int8"
    return _finish(decoder, fuse, layer_ops_required=False)  # the C++ glue: ~12 ms less per 1.5B step


def quantize_decoder_q4(decoder: nn.Module, q4k_blocks: dict[str, np.ndarray] | None = None,
                        low_bit: set[str] | frozenset[str] = frozenset(),
                        q6k_blocks: dict[str, np.ndarray] | None = None, every_layer: bool = False,
                        fuse: bool = True) -> nn.Module:
    """The mode ``int4``, in place: linear layers in the 4-bit format, attention row-wise, so the
    model is batch-invariant (exact speculation) like the int8 one.

    Which layers: from a GGUF, its Q4_K tensors with their own values, and the tensors it stores in
    fewer than 6 bits (``low_bit``: Q5_0… — most of the 0.5B draft) rounded to 4; its Q6_K tensors
    (the LM head and half of the v/down projections of a Q4_K_M file) with their own values too
    (:class:`~specdec.kernels.q6.Q6Linear`); Q8_0/F16 ones become int8 per channel
    (:class:`~specdec.kernels.q4.Q8Linear`), keeping their precision. Without GGUF blocks (HF
    directories, tests) every layer but the LM head is rounded to 4 bits; the head stays int8
    (llama.cpp's convention too: logits are the most quantization-sensitive output).
    ``every_layer`` (mode ``int4-all``, drafts): everything not already Q4_K is rounded to 4 bits —
    for the 0.5B draft the int8 LM head was over a third of a step's bytes. ``fuse``: as
    :func:`quantize_decoder`."""
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
    decoder.quantization = "int4"
    return _finish(decoder, fuse, layer_ops_required=True)


def fuse_projections(decoder: nn.Module) -> list[nn.Module]:
    """q|k|v and gate|up each become one kernel call where their layers are of one kind: the same
    input is quantized once and a small model's step makes ~3 fewer calls per layer (per-call
    overhead is a large share of a 0.5B draft's step on a CPU). Every output is bit-identical to the
    separate calls' (rows keep their scales); state_dict and weight_bytes are unchanged (see
    ``Attention.set_fused_projections``). Mixed kinds (a Q6_K v projection beside Q4_K q/k) stay
    separate calls. Returns the fused layers (outside the module tree: :func:`pack_int8_layers`)."""
    fused = []
    for module in decoder.modules():
        names = getattr(module, "FUSABLE_PROJECTIONS", None)
        if names is None:
            continue
        parts = [getattr(module, n) for n in names]
        kind = type(parts[0])
        if hasattr(kind, "concat") and all(type(p) is kind for p in parts):
            fused.append(kind.concat(parts))
            module.set_fused_projections(fused[-1])
    return fused


def pack_int8_layers(modules: list[nn.Module]) -> None:
    """Prepack the int8 layers among ``modules`` not packed yet (a loader's, fused ones), on as many
    threads as torch uses: fbgemm's prepacking is single-threaded, ~240 MB/s here, and was most of an
    int8 model's load (9.8 s of the default pair's prompt twins); two threads pack 1.5× faster."""
    layers = [module for module in modules if isinstance(module, Int8Linear)]
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        list(pool.map(Int8Linear.pack, layers))


def set_batch_invariant(decoder: nn.Module, enabled: bool) -> None:
    """Attention row by row (each query with exactly the shapes it has alone) or batched."""
    for module in decoder.modules():
        if hasattr(module, "row_wise_attention"):
            module.row_wise_attention = enabled


def quantized_state(decoder: nn.Module) -> dict[str, torch.Tensor]:
    """Everything needed to rebuild the quantized decoder (int8 weights, scales, float rest)."""
    state = {k: v.contiguous() for k, v in decoder.state_dict().items() if not k.endswith("_packed")}
    # int4 layers fused into one call are views of the fused rows; safetensors wants owned storage
    return {k: v if v.untyped_storage().nbytes() == v.nbytes else v.clone() for k, v in state.items()}


def load_quantized_state(decoder: nn.Module, state: dict[str, torch.Tensor], fuse: bool = True) -> nn.Module:
    """Inverse of :func:`quantized_state` on a float decoder skeleton (built on the meta device):
    int8 layers (``qweight``/``scales``), the int4 mode's (Q4Linear, Q6Linear, Q8Linear) and a
    :class:`BlockEmbedding` token table. The decoder keeps copies, not ``state``'s tensors: those
    may be views of a mapped file, whose touched pages would stay resident as long as one of them
    lived (measured: 1.5 GB of a 1.5B int8 model's cache file, on top of the weights in use)."""
    state = dict(state)
    kinds = set()
    for name, module in list(decoder.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                prefix = f"{name}.{child_name}" if name else child_name
                bias = state.get(f"{prefix}.bias")
                bias = None if bias is None else bias.clone()
                kind = next((k for k in INT4_MODE_LAYERS if f"{prefix}.{k.BUFFERS[0]}" in state), None)
                if kind is not None:
                    layer: nn.Module = kind(*(state[f"{prefix}.{b}"].clone() for b in kind.BUFFERS), bias)
                else:  # packed in _finish, after fusing (prepacking copies the weights: no clone)
                    layer = Int8Linear(state[f"{prefix}.qweight"], state[f"{prefix}.scales"].clone(), bias, pack=False)
                kinds.add(type(layer))
                setattr(module, child_name, layer)
    if "model.embed_tokens.blocks" in state:
        decoder.model.embed_tokens = BlockEmbedding(state.pop("model.embed_tokens.blocks").clone(),
                                                    state.pop("model.embed_tokens.quant_type"),
                                                    decoder.config.hidden_size)
    first_buffers = (".qweight", *(f".{k.BUFFERS[0]}" for k in INT4_MODE_LAYERS))
    quantized = {k.rsplit(".", 1)[0] for k in state if k.endswith(first_buffers)}
    rest = {k: v.clone() for k, v in state.items() if k.rsplit(".", 1)[0] not in quantized}
    decoder.load_state_dict(rest, strict=False, assign=True)
    decoder.quantization = "int4" if kinds & set(INT4_MODE_LAYERS) else "int8"
    return _finish(decoder, fuse, layer_ops_required=decoder.quantization == "int4")


def _finish(decoder: nn.Module, fuse: bool, layer_ops_required: bool) -> nn.Module:
    """What every conversion ends with, in this order: attention row-wise, projections fused, then
    the C++ layer runner (it captures the fused projections when it is made)."""
    set_batch_invariant(decoder, True)
    fused = fuse_projections(decoder) if fuse else []
    pack_int8_layers([*decoder.modules(), *fused])
    use_layer_ops(decoder, required=layer_ops_required)
    return decoder
