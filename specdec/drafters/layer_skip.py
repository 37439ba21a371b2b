"""Self-speculation from the target's own weights: layer skip (Draft & Verify, Zhang et al. 2023;
SWIFT, Xia et al. 2024) and early exit (the first L layers + final norm + LM head; LayerSkip).

The drafter runs the target's decoder with only a subset of its layers — skipped layers pass the
residual stream through — so it holds no weights of its own (``weights_shared_with`` proves it) and
needs no compatible draft model. Verification is the usual full-model pass, so output is exact.

**KV cache: the drafter writes into the target's own cache, above the committed length.** When it
is asked to propose, the target cache holds every committed token but the newest (the engine feeds
that one at the head of the verification chunk). The drafter appends the newest token and its
drafts through its layers, then truncates the cache back. That is exact, because the target's
verification pass writes every slot from the committed length on — for every layer — before any
attention reads it, and never reads beyond its chunk. What it buys:

* zero extra memory — not even a KV cache (a separate draft cache would cost ``layers × seq`` K/V);
* for **early exit** the committed entries of layers < L are exactly what the draft would compute
  itself (same layers, same inputs), so sharing changes nothing numerically;
* for **layer skip** a run layer after a skipped one would see a different residual than the full
  model, so its committed K/V in the target cache are the full model's, not the draft's own. The
  draft thus attends to *better* context than a self-contained skip model (as SWIFT does); this is
  a property of the proposal only and cannot affect the output.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Generator, Sequence

import torch

from specdec.backends.base import SequenceState
from specdec.backends.torch_backend import TorchBackend
from specdec.calls import ModelCall, run_now
from specdec.drafters.base import Draft, Drafter, DrafterResources, MethodInfo
from specdec.drafters.model_steps import draft_steps, next_token_steps
from specdec.drafters.vocab import usable_vocab_limit
from specdec.errors import SpecdecError
from specdec.paths import specdec_home
from specdec.penalties import Penalties, penalty_shape
from specdec.sampling import SamplingParams
from specdec.structured import GrammarConstraint
from specdec.tree import TreeLayout

log = logging.getLogger(__name__)


def _module_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


class LayerSubset:
    """The target backend restricted to ``layers`` (ascending indices): a read-only view, no copies."""

    def __init__(self, backend: TorchBackend, layers: Sequence[int]) -> None:
        num_layers = backend.config.num_layers
        layers = sorted(set(int(i) for i in layers))
        if not layers:
            raise SpecdecError("layer skip: at least one layer must run (got an empty layer set)")
        bad = [i for i in layers if not 0 <= i < num_layers]
        if bad:
            raise SpecdecError(f"layer skip: layer indices {bad} are outside 0..{num_layers - 1} for this model")
        self.backend = backend
        self.layers = layers
        self.config = backend.config
        self.device = backend.device
        self.dtype_name = backend.dtype_name

    def forward(self, state: KVCache, tokens: Sequence[int], num_logits: int | None = None,
                tree: TreeLayout | None = None, vocab_limit: int | None = None) -> torch.Tensor:
        return self.backend.forward(state, tokens, num_logits=num_logits, layers=self.layers, vocab_limit=vocab_limit,
                                    tree=tree)

    @property
    def weight_bytes(self) -> int:
        """The target's bytes per step minus those of the skipped layers."""
        decoder_layers = self.backend.decoder.model.layers
        skipped = sum(_module_bytes(decoder_layers[i]) for i in range(len(decoder_layers)) if i not in self.layers)
        return self.backend.weight_bytes - skipped

    @property
    def skipped(self) -> list[int]:
        return [i for i in range(self.config.num_layers) if i not in self.layers]


class LayerSkipDrafter(Drafter):
    """Drafts with a subset of the target's layers, in the target's own KV cache (see module doc)."""

    name = "layer_skip"

    def __init__(self, subset: LayerSubset, params: SamplingParams, generator: torch.Generator,
                 confidence_threshold: float = 0.0, vocab_limit: int | None = None,
                 constraint: GrammarConstraint | None = None, stop_ids: frozenset[int] = frozenset()) -> None:
        self.backend = subset
        self.stop_ids = stop_ids  # the request's stop tokens: min_tokens bans them from q as from p
        self.constraint = constraint  # structured output: masks q like p (see draft_steps)
        self.penalties: Penalties | None = None  # the request's logit bias and penalties (set by start)
        self.vocab_limit = usable_vocab_limit(vocab_limit, subset.config.vocab_size)
        self.params = params
        self.generator = generator
        self.confidence_threshold = confidence_threshold
        self.state: SequenceState | None = None

    @property
    def weight_bytes(self) -> int:
        return self.backend.weight_bytes

    def bind_target_state(self, state: SequenceState) -> None:
        """The engine hands over the target's cache of this request (before its prefill)."""
        self.state = state

    def start(self, prompt_ids: list[int]) -> None:
        self.penalties = Penalties.build(self.params, prompt_ids, self.backend.config.vocab_size, self.stop_ids, strict=False)

    def propose(self, context_ids: list[int], k: int) -> Draft:
        state = self.state
        if state is None:
            raise RuntimeError("LayerSkipDrafter needs the target's cache: the engine calls bind_target_state()")
        committed = state.seq_len
        if committed != len(context_ids) - 1:
            raise RuntimeError(f"target cache holds {committed} positions, expected {len(context_ids) - 1}")
        k = max(0, min(k, state.max_seq_len - len(context_ids)))
        if k == 0:
            return Draft(tokens=[])
        greedy = self.params.is_greedy

        def step(token: int) -> Generator[ModelCall, torch.Tensor, torch.Tensor]:
            return (yield from next_token_steps(self.backend, state, [token], self.vocab_limit, greedy))

        def proposal() -> Generator[ModelCall, torch.Tensor, Draft]:
            logits = yield from step(context_ids[-1])
            return (yield from draft_steps(logits, step, k, self.params, self.generator, self.confidence_threshold,
                                           constraint=self.constraint, shape=penalty_shape(self.penalties, context_ids),
                                           position=len(context_ids)))

        try:  # in the target's own cache, so never batched with other requests: run at once
            return run_now(proposal())
        finally:
            state.truncate(committed)  # the verification pass rewrites these slots for all layers

    def finish(self) -> None:
        self.state = None

    def weights_shared_with(self, target: TorchBackend) -> bool:
        """True when every tensor the drafter reads is a tensor of ``target`` (no copies)."""
        ours = {t.data_ptr() for t in self.backend.backend.decoder.state_dict().values()}
        theirs = {t.data_ptr() for t in target.decoder.state_dict().values()}
        return ours <= theirs


def calibration_path(model_path: Path | str, dtype_name: str) -> Path:
    """One file per (model file, execution dtype): timings of int8 and float32 differ. Written by
    ``specdec calibrate-skip`` (:mod:`specdec.calibrate`), read here by ``--skip-layers auto``."""
    resolved = Path(model_path).expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:10]
    return specdec_home() / "calibration" / f"{resolved.stem}-{digest}.{dtype_name}.layer-skip.json"


def load_calibration(model_path: Path | str, dtype_name: str) -> dict | None:
    path = calibration_path(model_path, dtype_name)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        _ = [int(i) for i in data["skip_layers"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise SpecdecError(f"calibration file {path} is unreadable ({exc}); run `specdec calibrate-skip` again") from None
    return data


def _require_torch_backend(backend, method: str) -> TorchBackend:  # noqa: ANN001
    if not isinstance(backend, TorchBackend):
        raise SpecdecError(f"method '{method}' runs the target's own layers and needs specdec's torch backend")
    return backend


def default_skip_layers(num_layers: int) -> list[int]:
    """Without a calibration: every other layer of the upper half (never the last one)."""
    return list(range(num_layers // 2, num_layers - 1, 2)) or [num_layers - 1]


def resolve_skip_layers(value: str | Sequence[int] | None, backend: TorchBackend, model_path) -> list[int]:  # noqa: ANN001
    """``--skip-layers``: explicit indices ("3,5,7-12"); "auto" = the saved calibration (required);
    None = the saved calibration when there is one, else :func:`default_skip_layers`."""
    if value is None or value == "auto":
        saved = load_calibration(model_path, backend.dtype_name) if model_path is not None else None
        if saved is not None:
            speedup = saved.get("speedup")
            if isinstance(speedup, (int, float)) and 0 < speedup < 1:  # calibrate-skip said so once; generate did not
                log.warning("the saved skip set %s ran %.2fx plain decoding when calibrate-skip measured it "
                            "(layer_skip does not pay for this model here)", saved["skip_layers"], speedup)
            return [int(i) for i in saved["skip_layers"]]
        if value == "auto":
            where = calibration_path(model_path, backend.dtype_name) if model_path is not None else "(no model path)"
            raise SpecdecError(
                f"--skip-layers auto: no calibration at {where}; run `specdec calibrate-skip --model MODEL` "
                "first, or give the layers (e.g. --skip-layers 14-20)"
            )
        return default_skip_layers(backend.config.num_layers)
    if isinstance(value, str):
        return parse_layer_list(value)
    if not isinstance(value, (list, tuple)) or any(not isinstance(i, int) or isinstance(i, bool) for i in value):
        raise SpecdecError(f"skip_layers must be 'auto', a list like '3,5,7-12' or a list of layer indices, got {value!r}")
    return list(value)


def parse_layer_list(text: str) -> list[int]:
    """"3,5,7-9" → [3, 5, 7, 8, 9]; "" → []."""
    layers: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if low > high:  # range() was empty: the layers silently stayed in
                    raise SpecdecError(f"layer range {part!r} runs backwards: write it {high}-{low}")
                layers.extend(range(low, high + 1))
            else:
                layers.append(int(part))
        except ValueError:
            raise SpecdecError(f"cannot read layer list {text!r}: use indices and ranges like 3,5,7-12") from None
    return sorted(set(layers))


def _threshold(spec) -> float:  # noqa: ANN001
    return spec.draft_confidence_threshold if spec.adaptive else 0.0


#: the whole-model warnings said in this process (drafters are built per request: a server said it per request)
_WARNED_WHOLE_MODEL: set[tuple[str, int]] = set()


def warn_whole_model(what: str, num_layers: int) -> None:
    """A self-drafter that runs all the target's layers drafts with the target itself: each draft token costs a
    full target step, so any token it drafts costs more than it saves. Allowed (the output is unchanged, and it is a
    way to measure overheads), but said — once per setting and process."""
    if (what, num_layers) in _WARNED_WHOLE_MODEL:
        return
    _WARNED_WHOLE_MODEL.add((what, num_layers))
    log.warning("%s: the draft runs all %d layers of the target, so each draft token costs a target step and "
                "speculation is slower than plain decoding", what, num_layers)


def make_layer_skip_drafter(res: DrafterResources) -> LayerSkipDrafter:
    backend, spec = _require_torch_backend(res.target_backend, "layer_skip"), res.spec
    skip = resolve_skip_layers(spec.skip_layers, backend, res.target_path)
    num_layers = backend.config.num_layers
    bad = [i for i in skip if not 0 <= i < num_layers]
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (f" … ({len(bad)} layers)" if len(bad) > 5 else "")
        raise SpecdecError(f"--skip-layers (skip_layers=) {shown} outside 0..{num_layers - 1}: this model has {num_layers} layers")
    run = [i for i in range(num_layers) if i not in set(skip)]
    if len(run) == num_layers:
        warn_whole_model("--skip-layers (skip_layers=) skips no layer", num_layers)
    return LayerSkipDrafter(LayerSubset(backend, run), res.params, res.generator, _threshold(spec),
                            spec.draft_vocab_size or None, res.constraint, res.stop_ids)


def make_early_exit_drafter(res: DrafterResources) -> LayerSkipDrafter:
    backend, spec = _require_torch_backend(res.target_backend, "early_exit"), res.spec
    num_layers = backend.config.num_layers
    exit_layer = spec.exit_layer if spec.exit_layer is not None else num_layers // 2
    if not 1 <= exit_layer <= num_layers:
        raise SpecdecError(f"--exit-layer (exit_layer=) must be in 1..{num_layers} for this model, got {exit_layer}")
    if exit_layer == num_layers:
        warn_whole_model(f"--exit-layer (exit_layer=) {exit_layer} is every layer", num_layers)
    drafter = LayerSkipDrafter(LayerSubset(backend, range(exit_layer)), res.params, res.generator, _threshold(spec),
                               spec.draft_vocab_size or None, res.constraint, res.stop_ids)
    drafter.name = "early_exit"
    return drafter


SELF_OPTIONS = ("num_speculative_tokens", "draft_confidence_threshold", "draft_vocab_size")
METHODS = (
    MethodInfo("layer_skip", make_layer_skip_drafter, "self-speculation: the target drafts with a subset of its layers",
               needs_torch_backend=True, options=(*SELF_OPTIONS, "skip_layers")),
    MethodInfo("early_exit", make_early_exit_drafter, "self-speculation: the target's first L layers and its LM head draft",
               needs_torch_backend=True, options=(*SELF_OPTIONS, "exit_layer")),
)
