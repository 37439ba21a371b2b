"""Write tiny GGUF files (quantized tensors included) the way llama.cpp's converter does."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from specdec.models.gguf_file import GGUF_GLOBAL_NAMES, GGUF_LAYER_NAMES

_OURS_TO_GGUF_LAYER = {v: k for k, v in GGUF_LAYER_NAMES.items()}
_OURS_TO_GGUF_GLOBAL = {v: k for k, v in GGUF_GLOBAL_NAMES.items()}
Q = gguf.GGMLQuantizationType


def gguf_name(ours: str) -> str:
    if ours in _OURS_TO_GGUF_GLOBAL:
        return _OURS_TO_GGUF_GLOBAL[ours]
    _, _, index, rest = ours.split(".", 3)
    return f"blk.{index}.{_OURS_TO_GGUF_LAYER[rest]}"


def permute_rope(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of Q/K rows for ``llama`` GGUFs (the loader must undo it)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path: Path, hf_model, config: dict, matrix_type=Q.Q8_0, tokenizer_dir: Path | None = None,
                    embedding_type=Q.F16) -> dict[str, np.ndarray]:
    """Write ``hf_model``'s weights as a GGUF; 2-D weights quantized to ``matrix_type``, the token
    table stored as ``embedding_type``.

    Returns the float reference: every tensor as the loader should produce it (quantize → dequantize).
    """
    arch = config["model_type"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if tokenizer_dir is not None:
        from tests.tokenizer_fixtures import add_tokenizer_to_gguf

        add_tokenizer_to_gguf(writer, tokenizer_dir)

    reference: dict[str, np.ndarray] = {}
    state = hf_model.state_dict()
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    for name, tensor in state.items():
        array = tensor.detach().float().numpy()
        heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
        kind = name.split(".")[-2]
        stored = permute_rope(array, heads[kind]) if arch == "llama" and kind in heads and name.endswith("weight") else array
        if array.ndim == 2:
            qtype = embedding_type if name == "model.embed_tokens.weight" else matrix_type
            data = stored.astype(np.float16) if qtype == Q.F16 else gguf.quants.quantize(stored, qtype)
            writer.add_tensor(gguf_name(name), data, raw_dtype=qtype)
            reference[name] = gguf.quants.dequantize(data, qtype).reshape(array.shape) if qtype != Q.F16 else array.astype(np.float16).astype(np.float32)
        else:
            writer.add_tensor(gguf_name(name), stored.astype(np.float32))
            reference[name] = array
        if arch == "llama" and kind in heads and name.endswith("weight"):  # reference is un-permuted
            reference[name] = _unpermute_ref(reference[name], stored, qtype if array.ndim == 2 else None, heads[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return reference


def _unpermute_ref(_ref: np.ndarray, stored: np.ndarray, qtype, heads: int) -> np.ndarray:
    deq = gguf.quants.dequantize(gguf.quants.quantize(stored, qtype), qtype).reshape(stored.shape) if qtype not in (None, Q.F16) else stored
    rows = deq.shape[0]
    return deq.reshape(heads, rows // heads // 2, 2, *deq.shape[1:]).swapaxes(1, 2).reshape(deq.shape)


def reference_state(reference: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in reference.items()}
