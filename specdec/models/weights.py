"""Weights from GGUF files and HF directories → a :class:`Decoder`.

GGUF tensors are dequantized with the ``gguf`` package (every type the default models use: Q4_K,
Q5_0, Q6_K, Q8_0, Q4_1, F16, F32 …). Dequantizing a 1.5B model takes tens of seconds, so the result
is cached as safetensors next to the model (one file per dtype) and the second start maps it in
seconds. Reading the GGUF itself (names, metadata, tensors) is :mod:`specdec.models.gguf_file`.

The quantized modes (``load_int8_decoder``, ``load_int4_decoder``) convert through
``specdec.kernels`` (this loader is where models meet kernels: the decoder itself imports none).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specdec.errors import WeightsError
from specdec.kernels.build import kernel
from specdec.kernels.convert import load_quantized_state, quantize_decoder, quantize_decoder_q4, quantized_state
from specdec.kernels.embedding import block_embedding_or_none
from specdec.kernels.q4 import PAIR
from specdec.models.config import ModelConfig
from specdec.models.gguf_file import gguf_config, gguf_embedding_rows, gguf_int4_sources, iter_gguf_tensors, open_gguf
from specdec.models.transformer import Decoder, rope_tables
from specdec.paths import specdec_home, write_safetensors

#: bump when a conversion changes (2: int4 runs tensors a GGUF stores in < 6 bits at 4 bits, not 8;
#: 3: int4 codes interleaved within blocks of 256 for the kernel, Q6_K tensors kept as 6-bit;
#: 4: the token embedding kept in its GGUF blocks, kernels/embedding.py; 5: 6-bit codes in vpdpbusd's order,
#: kernels/q6.py interleave_q6)
CACHE_FORMAT_VERSION = 5


def use_block_embedding(decoder: Decoder, gguf_path: Path) -> Decoder:
    """A quantized decoder's float32 token table → the GGUF's own blocks (kernels/embedding.py), where
    those dequantize to exactly the same rows. Only for the quantized modes: their LM head is its own
    kernel layer, so nothing else reads the float table."""
    found = gguf_embedding_rows(open_gguf(gguf_path))
    if found is not None:
        compact = block_embedding_or_none(*found, decoder.model.embed_tokens.weight.detach())
        if compact is not None:
            decoder.model.embed_tokens = compact
    return decoder


def read_config(path: Path) -> ModelConfig:
    """A model's shape without loading its weights (an HF directory's config.json or a GGUF's metadata).

    A GGUF's is kept beside its converted weights, keyed by the file's size and modification time:
    the gguf reader parses every metadata field before answering, the tokenizer's 151 k tokens and
    merges included — 7.5 s for each Qwen2.5 file here, and a speculative ``specdec generate`` read
    both files twice (30 of its 58 s)."""
    path = Path(path)
    if path.is_dir():
        return ModelConfig.from_hf_dir(path)
    if not path.is_file():
        return gguf_config(open_gguf(path))  # open_gguf's clear error
    stat = path.stat()
    return _gguf_config(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _gguf_config(path: Path, size: int, mtime_ns: int) -> ModelConfig:
    """:func:`read_config` of a GGUF file: from the saved copy when it was made from this version of
    the file (same size and mtime), else read and saved (an unwritable cache is only slower)."""
    saved_path = converted_cache_path(path, "config").with_suffix(".json")
    try:
        saved = json.loads(saved_path.read_text())
        if saved["gguf_size"] == size and saved["gguf_mtime_ns"] == mtime_ns:
            return ModelConfig(**saved["config"])
    except (OSError, ValueError, TypeError, KeyError):
        pass  # none yet, or unreadable: read the file
    cfg = gguf_config(open_gguf(path))
    try:
        saved_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = saved_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"gguf_size": size, "gguf_mtime_ns": mtime_ns, "config": cfg.to_dict()}))
        tmp.replace(saved_path)
    except OSError:
        pass
    return cfg


def gguf_state_dict(path: Path, dtype: torch.dtype, progress: bool = False) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    reader = open_gguf(path)
    cfg = gguf_config(reader)
    tensors = iter_gguf_tensors(reader, cfg)
    if progress:
        from tqdm import tqdm

        tensors = tqdm(tensors, total=len(reader.tensors), desc=f"dequantizing {Path(path).name}", unit="tensor")
    state = {name: torch.tensor(array, dtype=dtype) for name, array in tensors}
    return cfg, state


def hf_state_dict(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise WeightsError(f"no *.safetensors files in {path}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except (SafetensorError, OSError) as exc:
            raise WeightsError(f"{file} is corrupt or truncated: {exc}") from exc
    return state


def converted_cache_path(gguf_path: Path, dtype: torch.dtype | str) -> Path:
    """Where the converted weights of ``gguf_path`` are cached (a float dtype, or a quantized format
    name): beside it, or under specdec_home()."""
    gguf_path = Path(gguf_path).resolve()
    dtype_name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    name = f"{gguf_path.stem}.{dtype_name}.v{CACHE_FORMAT_VERSION}.safetensors"
    if os.access(gguf_path.parent, os.W_OK):
        return gguf_path.parent / name
    stat = gguf_path.stat()
    key = hashlib.sha1(f"{gguf_path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return specdec_home() / "converted" / key / name


#: tensor names of checkpoints other tools quantized (GPTQ/AWQ: qweight, qzeros, scales, g_idx; bitsandbytes:
#: weight.absmax, quant_map …, SCB; FP8: weight_scale(_inv)), which this loader does not read
PREQUANTIZED_TENSORS = ("qweight", "qzeros", "g_idx", "absmax", "quant_map", "quant_state", "SCB", "weight_format",
                        "weight_scale", "weight_scale_inv", "input_scale")
#: float8 dtypes (FP8 checkpoints: meaningful only with their scales)
FLOAT8_DTYPES = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
                      if hasattr(torch, name))


def build_decoder(cfg: ModelConfig, state: dict[str, torch.Tensor], dtype: torch.dtype, device: str) -> Decoder:
    """Instantiate without initialising (meta device) and adopt the loaded tensors."""
    with torch.device("meta"):
        model = Decoder(cfg)
    state = dict(state)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {name for name, _ in model.named_parameters()}
    missing, unexpected = expected - set(state), set(state) - expected - {"lm_head.weight"}
    quantized = sorted(name for name in unexpected if name.rsplit(".", 1)[-1] in PREQUANTIZED_TENSORS)
    quantized += sorted(name for name, tensor in state.items() if tensor.dtype in FLOAT8_DTYPES)
    if quantized:  # GPTQ/AWQ (codes under other names), bitsandbytes (packed codes, absmax), FP8 (scaled float8)
        raise WeightsError(f"these weights are already quantized by another tool ({quantized[0]}): specdec reads float "
                           f"weights (safetensors) or a GGUF and quantizes them itself (--quantize); give the model's "
                           f"original float checkpoint")
    if missing:
        raise WeightsError(f"weights are missing {len(missing)} tensors, e.g. {sorted(missing)[0]}")
    beyond = sorted({int(match.group(1)) for name in unexpected if (match := re.match(r"model\.layers\.(\d+)\.", name))
                     and int(match.group(1)) >= cfg.num_layers})
    if beyond:  # a config saying fewer layers than the weights hold: the rest were dropped without a word
        raise WeightsError(f"the weights hold layers up to {beyond[-1]} but the config says num_hidden_layers "
                           f"{cfg.num_layers}: the config does not match these weights")
    for name in unexpected:  # buffers some checkpoints save (rotary inv_freq …)
        state.pop(name)
    for name, param in model.named_parameters():
        if tuple(state[name].shape) != tuple(param.shape):
            raise WeightsError(f"tensor {name} has shape {tuple(state[name].shape)}, expected {tuple(param.shape)}")
        if not state[name].is_floating_point():  # cast to float it would run as numbers nobody trained
            raise WeightsError(f"tensor {name} holds {str(state[name].dtype).removeprefix('torch.')} values, expected "
                               "floating point: the file is not a float checkpoint (or is corrupt)")
    model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()}, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # buffers (RoPE tables) were created on meta: rebuild them for real
    cos, sin = rope_tables(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval()


def load_decoder(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu", progress: bool = False) -> Decoder:
    """Load a GGUF file or an HF directory (config.json + safetensors) as a :class:`Decoder`."""
    path = Path(path)
    if path.is_dir():
        cfg = ModelConfig.from_hf_dir(path)
        return build_decoder(cfg, hf_state_dict(path), dtype, device)
    if path.suffix != ".gguf" and path.is_file():
        raise WeightsError(f"{path}: expected a .gguf file or a directory with config.json")
    cache_file = converted_cache_path(path, dtype)
    meta_file = cache_file.with_suffix(".json")
    if cache_file.is_file() and meta_file.is_file() and _cache_is_fresh(path, meta_file):
        try:
            cfg = ModelConfig(**json.loads(meta_file.read_text())["config"])
            return build_decoder(cfg, load_file(str(cache_file)), dtype, device)
        except (SafetensorError, OSError, KeyError, TypeError, json.JSONDecodeError):
            pass  # a broken cache is rebuilt below
    cfg, state = gguf_state_dict(path, dtype, progress=progress)
    _write_cache(path, cfg, state, cache_file, meta_file)
    return build_decoder(cfg, state, dtype, device)


def _source_signature(path: Path) -> dict[str, int]:
    stat = Path(path).stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _cache_is_fresh(gguf_path: Path, meta_file: Path) -> bool:
    try:
        return json.loads(meta_file.read_text()).get("source") == _source_signature(gguf_path)
    except (OSError, json.JSONDecodeError):
        return False


def _write_cache(gguf_path: Path, cfg: ModelConfig, state: dict[str, torch.Tensor], cache_file: Path, meta_file: Path) -> bool:
    """Best effort: a read-only or full disk only costs the next start its speed. True if written."""
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        write_safetensors({k: v.contiguous() for k, v in state.items()}, cache_file)
        meta_file.write_text(json.dumps({"config": cfg.to_dict(), "source": _source_signature(gguf_path)}))
        remove_stale_caches(cache_file)
    except OSError:
        return False
    return True


def remove_stale_caches(cache_file: Path) -> list[Path]:
    """Delete the same conversion in older cache formats (``<stem>.<fmt>.v<N>.*``, N below the
    current version): each is as large as the model and no version of specdec reads them again."""
    stem, fmt, _ = cache_file.name.rsplit(".", 3)[:3]
    removed = []
    for old in cache_file.parent.glob(f"{stem}.{fmt}.v*.*"):
        version = old.name[len(f"{stem}.{fmt}.v"):].split(".", 1)[0]
        if version.isdigit() and int(version) < CACHE_FORMAT_VERSION and old.suffix in (".safetensors", ".json"):
            old.unlink(missing_ok=True)
            removed.append(old)
    return removed


def load_int8_decoder(path: str | Path, device: str = "cpu", progress: bool = False) -> Decoder:
    """The batch-invariant int8 model (see kernels/int8.py), cached next to a GGUF after the first
    conversion so later starts skip dequantization and quantization."""
    if device != "cpu":
        raise WeightsError("int8 execution is a CPU path (fbgemm); use --quantize none on CUDA")
    return _load_converted(Path(path), "int8", lambda: quantize_decoder(load_decoder(path, torch.float32, device, progress=progress)))


def load_int4_decoder(path: str | Path, device: str = "cpu", progress: bool = False, every_layer: bool = False) -> Decoder:
    """4-bit weights through the batch-invariant kernel (kernels/q4.py; a GGUF's Q4_K tensors as they
    are), cached beside a GGUF like the int8 conversion. ``every_layer`` (mode ``int4-all``, for
    drafts): the layers a GGUF stores more precisely, the LM head included, are rounded to 4 bits too."""
    if device != "cpu":
        raise WeightsError("int4 execution is a CPU path; use --quantize none on CUDA")
    path = Path(path)
    cfg = read_config(path)
    sizes = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim)
    if any(size % PAIR for size in sizes):
        raise WeightsError(f"int4 needs layer input sizes that are multiples of {PAIR}; {path.name} has "
                           f"{', '.join(map(str, sizes))}: use --quantize int8")
    kernel()  # a missing compiler fails now, not after the conversion

    def convert() -> Decoder:
        decoder = load_decoder(path, torch.float32, device, progress=progress)
        if path.is_dir():
            return quantize_decoder_q4(decoder, every_layer=every_layer)
        reader = open_gguf(path)
        return quantize_decoder_q4(decoder, *gguf_int4_sources(reader, gguf_config(reader)), every_layer=every_layer)

    return _load_converted(path, "int4-all" if every_layer else "int4", convert)


def _load_converted(path: Path, fmt: str, convert: Callable[[], Decoder]) -> Decoder:
    """A quantized model from its cache beside the GGUF, or ``convert()`` and cache the result
    (HF directories are converted every time: their weights load fast)."""
    if path.is_dir():
        return convert()
    cache_file = converted_cache_path(path, fmt)
    meta_file = cache_file.with_suffix(".json")
    model = _read_converted(path, cache_file, meta_file)
    if model is not None:
        return model
    model = use_block_embedding(convert(), path)
    if not _write_cache(path, model.config, quantized_state(model), cache_file, meta_file):
        return model
    # Served from the cache, as every later start is: the converted model's float parts (norms,
    # biases) are views of the float32 conversion's mapped file, which kept up to 2.4 GB of it resident.
    del model
    model = _read_converted(path, cache_file, meta_file)
    if model is None:
        raise WeightsError(f"{cache_file} was written but cannot be read back (disk full or failing?)")
    return model


def _read_converted(path: Path, cache_file: Path, meta_file: Path) -> Decoder | None:
    """The cached conversion, or None where it is missing, stale or unreadable."""
    if not (cache_file.is_file() and meta_file.is_file() and _cache_is_fresh(path, meta_file)):
        return None
    try:
        cfg = ModelConfig(**json.loads(meta_file.read_text())["config"])
        with torch.device("meta"):
            model = Decoder(cfg)
        model = load_quantized_state(model, load_file(str(cache_file)))
        model.rope_cos, model.rope_sin = rope_tables(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        return model.eval()
    except (SafetensorError, OSError, KeyError, TypeError, json.JSONDecodeError):
        return None
