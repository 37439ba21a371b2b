"""A trained head's directory: ``config.json`` (:class:`~specdec.models.heads.HeadConfig`: its
shape and the target it was trained on) and ``model.safetensors`` — written, read back with clear
errors for what is missing or does not fit, and loaded once per process for the target it serves
(int8 linears where the target runs quantized on the CPU)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch import nn

from specdec.errors import SpecdecError, WeightsError
from specdec.models.config import ModelConfig
from specdec.models.heads import (DRAFT_VOCABS, HEAD_KINDS, DraftHead, EagleHead, HeadConfig, MedusaHeads,
                                  check_feature_layers)
from specdec.paths import write_safetensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def quantize_head(head: DraftHead) -> DraftHead:
    """The head's linear layers as int8 (per-channel weights, per-token activations; the target's
    int8 kernel), in place: a quarter of the bytes per draft step. It only proposes, so its rounding
    costs at most acceptance, never exactness. EAGLE's ``fc`` stays float: it reads raw target
    features, whose few huge channels (hundreds of times the rest) set a per-token int8 scale that
    rounds every other channel to nothing — measured on the 1.5B target, an int8 fc cut acceptance
    at the second draft token from 0.08 to 0.00 (float fc: 0.30/0.08/0.02 by position). EAGLE-3's
    ``fuse`` reads raw target features too: float."""
    from specdec.kernels.int8 import Int8Linear, int8_available

    if not int8_available():
        return head
    float_inputs = [getattr(head, "fc", None), getattr(head, "fuse", None)]  # (a Medusa head has neither)
    for module in list(head.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and not any(child is kept for kept in float_inputs):
                setattr(module, name, Int8Linear.from_float(child.weight, child.bias))
    return head


def save_head(head: DraftHead, directory: str | Path, training: dict[str, Any] | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (float32 weights) into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = asdict(head.config)
    if training is not None:
        config["training"] = training
    state = {name: (tensor.detach().float() if tensor.is_floating_point() else tensor.detach()).cpu().contiguous()
             for name, tensor in head.state_dict().items()}  # draft_ids stay integers
    write_safetensors(state, directory / WEIGHTS_FILE)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return directory


def read_head_config(directory: str | Path) -> HeadConfig:
    directory = Path(directory)
    path = directory / CONFIG_FILE
    if not directory.is_dir():
        raise WeightsError(f"drafter path {directory} is not a directory (train one with `specdec train-drafter`)")
    if not path.is_file():
        raise WeightsError(f"{directory} has no {CONFIG_FILE}: not a trained drafter directory")
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "model_type" in data and "kind" not in data:  # a model's (a distilled draft's)
            raise WeightsError(f"{directory} holds a model ({data['model_type']}), not a trained head: a distilled "
                               "draft runs as --draft-model FOLDER")
        config = HeadConfig(**data)
    except (ValueError, TypeError) as exc:
        raise WeightsError(f"{path} is not a valid head config: {exc}") from None
    if config.kind not in HEAD_KINDS:
        raise WeightsError(f"{path}: unknown head kind {config.kind!r}; available: {', '.join(HEAD_KINDS)}")
    if config.draft_vocab not in DRAFT_VOCABS:
        raise WeightsError(f"{path}: unknown draft vocabulary {config.draft_vocab!r}; available: {', '.join(DRAFT_VOCABS)}")
    try:
        check_feature_layers(config.read_layers, config.target.get("num_layers", config.read_layers[-1]), config.kind)
    except (SpecdecError, KeyError) as exc:
        raise WeightsError(f"{path}: {exc}") from None
    return config


def load_head(directory: str | Path, target: ModelConfig | None = None) -> DraftHead:
    """A trained head from ``directory`` (float32, CPU), checked against ``target`` when given."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    config = read_head_config(directory)
    if target is not None:
        config.check_target(target)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise WeightsError(f"{directory} has no {WEIGHTS_FILE}")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise WeightsError(f"{weights} is not a readable safetensors file: {exc}") from None
    head = EagleHead(config) if config.kind == "eagle" else MedusaHeads(config)
    try:
        head.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise WeightsError(f"{weights} does not match its config.json: {exc}") from None
    return head.eval().requires_grad_(False)


#: loaded heads by (directory, weights' mtime, target decoder, kind): a drafter factory runs per request
_LOADED: dict[tuple[str, int, int, str], DraftHead] = {}


def head_kind_phrase(kind: str) -> str:
    """"an eagle head", "a medusa head"."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} head"


def trained_head(decoder: nn.Module, directory: str | Path, kind: str) -> DraftHead:
    """The ``kind`` head in ``directory`` for the target ``decoder``, loaded once per process: int8
    linears when the target runs quantized on the CPU (a quarter of the bytes per draft step),
    float otherwise. A clear error when the directory holds another kind or another target's head."""
    path = Path(directory).expanduser().resolve()
    weights = path / WEIGHTS_FILE
    key = (str(path), weights.stat().st_mtime_ns if weights.is_file() else 0, id(decoder), kind)
    if key not in _LOADED:
        config = read_head_config(path)
        if config.kind != kind:
            raise SpecdecError(f"{path} holds {head_kind_phrase(config.kind)}, not a {kind} one: use method {config.kind!r}")
        head = load_head(path, decoder.config)
        if decoder.quantization is not None and decoder.device.type == "cpu":
            quantize_head(head)
        _LOADED.clear()  # one head per process at a time: a server serves one pair
        _LOADED[key] = head.to(decoder.device)
    return _LOADED[key]
