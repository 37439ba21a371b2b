"""Model hyper-parameters, read from an HF ``config.json`` or from GGUF metadata.

One dataclass covers the Llama family we run (Llama, SmolLM2, Qwen2): the variants differ only in
flags (QKV bias, tied LM head, RoPE base), so new architectures are added by config, not by copying
the model file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdec.errors import WeightsError

#: Architectures our decoder implements, mapped to whether attention projections carry a bias.
SUPPORTED_ARCHS: dict[str, bool] = {"llama": False, "qwen2": True}

#: HF ``model_type`` / ``architectures`` names → our arch names.
_HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "mistral": "llama"}


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False

    def __post_init__(self) -> None:
        sizes = {"vocab_size": self.vocab_size, "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                 "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
                 "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
                 "max_position_embeddings": self.max_position_embeddings}
        small = [f"{name} {value}" for name, value in sizes.items() if value < 1]
        if small:  # 0 layers decoded garbage (exit 0), 0 heads was an IndexError in a kernel
            raise WeightsError(f"the model config's sizes must be >= 1: {', '.join(small)}")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise WeightsError(f"the model config's rope_theta ({self.rope_theta}) and rms_norm_eps ({self.rms_norm_eps}) "
                               "must be > 0")
        if self.num_heads % self.num_kv_heads != 0:
            raise WeightsError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_hf_dict(self) -> dict[str, Any]:
        """An HF ``config.json`` that :meth:`from_hf_dict` (and transformers) read back as this config."""
        model_type = "qwen2" if self.arch == "qwen2" else "llama"
        return {
            "architectures": ["Qwen2ForCausalLM" if model_type == "qwen2" else "LlamaForCausalLM"],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "ModelConfig":
        model_type = cfg.get("model_type", "")
        arch = _HF_MODEL_TYPES.get(model_type)
        if arch is None and cfg.get("kind") in ("eagle", "medusa"):  # a `specdec train-drafter` head's config.json
            raise WeightsError(f"this folder holds a trained {cfg['kind']} head, not a model: use it with "
                               f"--method {cfg['kind']} --drafter-path FOLDER")
        if arch is None:
            raise WeightsError(
                f"unsupported model_type {model_type!r}; supported: {sorted(_HF_MODEL_TYPES)}"
            )
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None:  # transformers 5 nests it under rope_parameters
            rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return cls(
            arch=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or (hidden // num_heads if num_heads > 0 else 0)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            rope_theta=float(rope_theta),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
        )

    @classmethod
    def from_hf_dir(cls, path: Path) -> "ModelConfig":
        config_file = Path(path) / "config.json"
        if not config_file.is_file():
            raise WeightsError(f"no config.json in {path}")
        try:
            cfg = json.loads(config_file.read_text())
            if not isinstance(cfg, dict):
                raise TypeError(f"a JSON {type(cfg).__name__}, not an object")
            return cls.from_hf_dict(cfg)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:  # a field of the wrong kind ("nine" heads, null)
            what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            raise WeightsError(f"{config_file} is not a valid model config: {what}") from exc

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any], tensor_shapes: dict[str, tuple[int, ...]]) -> "ModelConfig":
        """Build from GGUF key/values (already decoded to Python values) and tensor shapes.

        GGUF omits what can be derived: the vocabulary size comes from the embedding's rows, and the
        LM head is tied exactly when there is no ``output.weight`` tensor.
        """
        arch = fields.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise WeightsError(
                f"unsupported GGUF architecture {arch!r}; supported: {sorted(SUPPORTED_ARCHS)}"
            )

        def get(key: str, default: Any = None) -> Any:
            value = fields.get(f"{arch}.{key}", default)
            if value is None:
                raise WeightsError(f"GGUF metadata is missing {arch}.{key}")
            return value

        hidden = int(get("embedding_length"))
        num_heads = int(get("attention.head_count"))
        embd_shape = tensor_shapes.get("token_embd.weight")
        if embd_shape is None:
            raise WeightsError("GGUF file has no token_embd.weight tensor")
        return cls(
            arch=arch,
            vocab_size=int(embd_shape[0]),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=int(get("block_count")),
            num_heads=num_heads,
            num_kv_heads=int(get("attention.head_count_kv", num_heads)),
            head_dim=int(fields.get(f"{arch}.attention.key_length") or hidden // num_heads),
            max_position_embeddings=int(get("context_length", 2048)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            tie_word_embeddings="output.weight" not in tensor_shapes,
            attention_bias=SUPPORTED_ARCHS[arch],
        )
