"""The step-cost probe: what one forward of a model's shape costs on this CPU, per execution mode and
chunk size, timed on two random layers and a small head and scaled to the full model
(:func:`measure_curves`). :mod:`specdec.step_costs` caches these curves and chooses modes from them.

Why a probe and not the model: step time is shapes, not values, so two layers of the model's own shape
with random weights time in seconds what loading every candidate mode of the real model would take
minutes to; the three parts (fixed cost, layers, head) are timed apart so each scales by its own factor.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch

from specdec.cost_model import Curve
from specdec.cpu import last_level_cache_bytes
from specdec.models.config import ModelConfig

#: chunk sizes the curve is measured at (others are interpolated; beyond the last, its slope): up to
#: 32 rows because several requests' drafts verified in one forward reach that many, and the slope
#: from 4 to 8 rows badly underestimated it (AVX2 int8: 2 requests × 5 rows cost 2.27 single steps,
#: the 1–8 curve extrapolated said 1.57; ragged-step-int8.md)
CHUNK_SIZES = (1, 2, 4, 8, 16, 32)
PROBE_LAYERS = 2
PROBE_VOCAB = 4096
PROBE_CONTEXT = 128


def probe_config(cfg: ModelConfig) -> ModelConfig:
    return dataclasses.replace(cfg, num_layers=PROBE_LAYERS, vocab_size=PROBE_VOCAB, max_position_embeddings=1024)


def _convert(decoder: torch.nn.Module, mode: str) -> torch.nn.Module:
    from specdec.kernels.convert import quantize_decoder, quantize_decoder_q4

    if mode == "int8":
        return quantize_decoder(decoder)
    if mode in ("int4", "int4-all"):
        return quantize_decoder_q4(decoder, every_layer=mode == "int4-all")
    raise ValueError(f"no step-cost probe for mode {mode!r}")


def _probe_backend(cfg: ModelConfig, mode: str):  # noqa: ANN202 - a TorchBackend
    from specdec.backends.torch_backend import TorchBackend
    from specdec.models.transformer import Decoder

    generator = torch.Generator().manual_seed(0)
    decoder = Decoder(probe_config(cfg))
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            param.copy_(torch.ones_like(param) if "norm" in name else 0.02 * torch.randn(param.shape, generator=generator))
    return TorchBackend(_convert(decoder.eval(), mode))


def measure_curves(cfg: ModelConfig, modes: tuple[str, ...], repeats: int = 7) -> dict[str, Curve]:
    """Time the probe model in every mode — interleaved (mode by mode within each repeat, so a
    busy moment costs every mode alike), the minimum of ``repeats`` (other load only adds time) —
    and scale it to ``cfg``'s depth and vocabulary.

    Three parts are timed apart and scaled apart: a step with no layers (embedding, final norm,
    the probe's small head and the per-step Python work: a fixed cost), the two layers (their
    difference from it; ×depth), and the head alone (×vocabulary). Scaling the whole probe step by
    the parameter ratio instead charged the fixed cost ~15 times: it put the 0.5B draft's step at
    27.6 ms where it runs in 14-16."""
    backends = {mode: _probe_backend(cfg, mode) for mode in modes}
    evict = _cache_evictor()
    tokens = torch.randint(0, PROBE_VOCAB, (PROBE_CONTEXT + max(CHUNK_SIZES),),
                           generator=torch.Generator().manual_seed(1)).tolist()
    states = {}
    for mode, backend in backends.items():
        states[mode] = backend.new_state(len(tokens) + 1)
        backend.forward(states[mode], tokens[:PROBE_CONTEXT], num_logits=1)
    hidden = {size: torch.randn(size, cfg.hidden_size, generator=torch.Generator().manual_seed(2)) for size in CHUNK_SIZES}
    parts = ("all", "none", "head")
    best: dict[tuple[str, str, int], float] = {}
    for repeat in range(repeats + 1):  # the first round is a warm-up
        for size in CHUNK_SIZES:
            chunk = tokens[PROBE_CONTEXT : PROBE_CONTEXT + size]
            for mode, backend in backends.items():
                for part in parts:
                    states[mode].truncate(PROBE_CONTEXT)
                    evict()
                    start = time.perf_counter()
                    if part == "head":
                        backend.decoder.lm_head(hidden[size])
                    else:
                        backend.forward(states[mode], chunk, layers=None if part == "all" else [])
                    seconds = time.perf_counter() - start
                    if repeat:
                        key = (mode, part, size)
                        best[key] = min(best.get(key, seconds), seconds)
    curves = {}
    head_scale = cfg.vocab_size / PROBE_VOCAB
    for mode, backend in backends.items():
        seconds = {}
        for size in CHUNK_SIZES:
            per_layer = max(0.0, best[(mode, "all", size)] - best[(mode, "none", size)]) / PROBE_LAYERS
            head = best[(mode, "head", size)]
            fixed = max(0.0, best[(mode, "none", size)] - head)
            seconds[size] = fixed + cfg.num_layers * per_layer + head * head_scale
        layer_bytes = (backend.weight_bytes - _head_bytes(backend)) / PROBE_LAYERS
        full_bytes = cfg.num_layers * layer_bytes + _head_bytes(backend) * head_scale
        curves[mode] = Curve(mode, seconds, full_bytes / seconds[1] / 1e9, full_bytes / 1e9)
    return curves


def _cache_evictor() -> Callable[[], None]:
    """A call that pushes the probe's weights out of the CPU caches, run before every timed forward.

    The probe's two layers (~33 MB for the 1.5B in int4) fit a server CPU's last-level cache, while
    a real step streams ~1 GB from memory: timed warm, the probe put a Zen 4 EPYC's int4 T=1 step at
    29 ms where the model runs it in 38, so every chunk looked 1.3× dearer against it than it is
    (T=4: 1.66× measured vs 1.26–1.34× real) and γ=auto, trees and batching drafted too little.
    Reading a buffer of twice the cache's size leaves the weights in memory only, as in decoding."""
    buffer = torch.ones(max(2 * last_level_cache_bytes(), 64 * 2**20) // 4)
    return lambda: float(buffer.sum())


def _head_bytes(backend) -> int:  # noqa: ANN001 - a TorchBackend
    """Bytes of the probe's LM head (its tensors, whatever the execution mode's format)."""
    head = backend.decoder.lm_head
    return sum(t.numel() * t.element_size() for t in [*head.parameters(), *head.buffers()])
