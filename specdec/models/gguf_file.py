"""Reading a GGUF file: its tensor names mapped to ours (= HF's), its metadata as a
:class:`ModelConfig`, its tensors dequantized to float32, and the raw blocks the int4 path and the
compact token table keep as they are. One name table per format; llama.cpp's Q/K row order undone here.

Apart from :mod:`specdec.models.weights` (which builds decoders and caches conversions) because this
part needs neither torch nor the kernels: only ``gguf`` and numpy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from specdec.errors import WeightsError
from specdec.models.config import ModelConfig

#: GGUF tensor name (``blk.{i}.`` prefix stripped for per-layer ones) → our parameter name.
GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

def our_name(gguf_name: str) -> str | None:
    """Map one GGUF tensor name to ours; ``None`` for tensors we do not use (e.g. rope_freqs)."""
    if gguf_name in GGUF_GLOBAL_NAMES:
        return GGUF_GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{GGUF_LAYER_NAMES[parts[2]]}"
    return None


def open_gguf(path: Path) -> Any:
    """Open a GGUF file, turning the reader's low-level failures into one clear error."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"no such file: {path}")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError/IndexError/struct errors on bad bytes
        raise WeightsError(f"{path} is not a readable GGUF file (truncated or corrupt?): {exc}") from exc
    file_size = path.stat().st_size
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > file_size:
            raise WeightsError(f"{path} is truncated: tensor {tensor.name} ends past the end of the file")
    return reader


def gguf_fields(reader: Any) -> dict[str, Any]:
    """All metadata key/values as Python values (strings, numbers, lists)."""
    fields: dict[str, Any] = {}
    for key, field in reader.fields.items():
        try:
            fields[key] = field.contents()
        except Exception:  # a field type this gguf version cannot decode: not one we need
            continue
    return fields


def gguf_config(reader: Any) -> ModelConfig:
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}
    return ModelConfig.from_gguf_fields(gguf_fields(reader), shapes)


def _unpermute_rope(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of Q/K rows for ``llama`` GGUFs (it interleaves RoPE halves)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def iter_gguf_tensors(reader: Any, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(our_name, float32 array)`` for every tensor the decoder uses."""
    import gguf

    for tensor in reader.tensors:
        name = our_name(tensor.name)
        if name is None:
            continue
        try:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as exc:
            raise WeightsError(
                f"tensor {tensor.name} has type {tensor.tensor_type.name}, which gguf cannot dequantize"
            ) from exc
        array = np.asarray(array, dtype=np.float32).reshape(tuple(reversed(tensor.shape.tolist())))
        if cfg.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_heads if name.endswith("q_proj.weight") else cfg.num_kv_heads
            array = _unpermute_rope(array, heads)
        yield name, array


def gguf_int4_sources(reader: Any, cfg: ModelConfig) -> tuple[dict[str, np.ndarray], set[str], dict[str, np.ndarray]]:
    """For the int4 path (kernels/q4.py): the raw bytes ``[rows, blocks·144]`` of every Q4_K tensor,
    by our name (rows in our order), to run with their own values; the names of the other tensors
    the file stores in fewer than 6 bits per weight (Q4_0, Q5_0, Q5_K…), which the int4 path rounds
    to 4 bits; and the raw ``[rows, blocks·210]`` of its Q6_K tensors (kernels/q6.py, own values
    too) — Q8_0/F16 ones keep 8 bits."""
    import gguf

    kinds = {gguf.GGMLQuantizationType.Q4_K: {}, gguf.GGMLQuantizationType.Q6_K: {}}
    low_bit: set[str] = set()
    for tensor in reader.tensors:
        name = our_name(tensor.name)
        if name is None or len(tensor.shape) < 2:
            continue
        if tensor.tensor_type not in kinds:
            block_size, type_size = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
            if 8 * type_size / block_size < 6:
                low_bit.add(name)
            continue
        rows = int(tensor.shape.tolist()[-1])
        raw = np.asarray(tensor.data, dtype=np.uint8).reshape(rows, -1)
        if cfg.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            raw = _unpermute_rope(raw, cfg.num_heads if name.endswith("q_proj.weight") else cfg.num_kv_heads)
        kinds[tensor.tensor_type][name] = raw
    return kinds[gguf.GGMLQuantizationType.Q4_K], low_bit, kinds[gguf.GGMLQuantizationType.Q6_K]


def gguf_embedding_rows(reader: Any) -> tuple[np.ndarray, int] | None:
    """The token table's raw rows ``[vocab, row_bytes]`` as the GGUF stores them, and its type; None
    where it is stored as plain floats (nothing to keep compact)."""
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            data = np.asarray(tensor.data)
            if data.dtype != np.uint8:  # F32/F16 tensors come back as float arrays
                return None
            return data.reshape(int(tensor.shape.tolist()[-1]), -1), int(tensor.tensor_type)
    return None
