"""DistillSpec (Zhou et al. 2024): align a draft model to its target by knowledge distillation.

Speculation accepts a drafted token with probability ``Σ min(p, q)`` (sampling) or when the draft's
argmax is the target's (greedy), so the draft that pays is the one closest to the *target*, not to
the data. DistillSpec trains the draft on the target's own distributions, with the divergence
chosen per task: forward KL(p‖q) (here ``kl``) or the total variation distance ``½Σ|p − q|``
(``tvd``, exactly 1 − α under sampling at temperature 1). ``greedy`` is the cross-entropy to the
target's greedy token alone (hard labels): greedy acceptance counts only whether the two argmaxes
agree, and a soft-label loss spends itself on the tails (on the 1.5B/0.5B Qwen pair, 50 minutes of
forward KL lowered the held-out KL 8 % and left the argmax agreement at 0.81). It needs no target
logits at all, so a step skips the target's LM head (batch 4 on an AMX Xeon: 2.8 s a step against
forward KL's 4.0 s). Measured on that pair it raised agreement over the target's continuations
0.877 → 0.884 at lr 1e-5 with batches of 16; at 1e-4 with batches of 4 it memorised its rows.

What fits a 2-core CPU: only the draft's last ``trainable_layers`` decoder layers and its final
norm train (float32); its embedding and LM head (tied in small Qwen models) stay frozen. The frozen
layers run once per sequence, before training (their outputs are stored beside the target's
feature shards, so a resumed run does not recompute them), and the target's distributions come from
its recorded features through its own final norm and LM head — no target forward during training.

The result is an ordinary model directory (``config.json``, ``model.safetensors``, tokenizer) that
``--draft-model DIR`` loads like any draft.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import SpecdecError
from specdec.models.transformer import Decoder
from specdec.paths import write_safetensors
from specdec.train.loop import RowLoss, data_row
from specdec.train.target_parts import TargetParts

DIVERGENCES = ("kl", "tvd", "greedy")


class DraftTail(nn.Module):
    """The trainable end of a draft model: its last ``trainable_layers`` decoder layers and final
    norm (the decoder's own modules, shared, in float32). The frozen embedding, earlier layers and
    LM head are read from ``decoder`` and are not part of this module's state."""

    def __init__(self, decoder: Decoder, trainable_layers: int) -> None:
        super().__init__()
        layers = decoder.config.num_layers
        if not 1 <= trainable_layers <= layers:
            raise SpecdecError(f"--trainable-layers must be between 1 and the draft's {layers} layers, got {trainable_layers}")
        self.split = layers - trainable_layers
        self.layers = nn.ModuleList(decoder.model.layers[self.split:])
        self.norm = decoder.model.norm
        object.__setattr__(self, "decoder", decoder)  # not a child: its frozen weights are not trained or checkpointed
        decoder.requires_grad_(False)
        self.requires_grad_(True)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [T, hidden]`` (the frozen layers' output for positions 0..T-1) → next-token
        logits ``[T, vocab]``. A fresh cache per layer: each is written once and read once, so
        autograd sees no in-place change to a tensor it saved."""
        seq = hidden.shape[0]
        decoder = self.decoder
        cos, sin = decoder.rope_cos[:seq], decoder.rope_sin[:seq]
        x = hidden
        for layer in self.layers:
            x = layer(x, cos, sin, decoder.new_cache(seq, torch.float32), 0, None)
        return decoder.lm_head(self.norm(x))


@torch.no_grad()
def frozen_hidden(decoder: Decoder, split: int, tokens: list[int]) -> torch.Tensor:
    """The draft's hidden states after its first ``split`` layers for ``tokens`` → ``[T, hidden]``."""
    seq = len(tokens)
    ids = torch.tensor(tokens, dtype=torch.long, device=decoder.device)
    x = decoder.model.embed_tokens(ids).float()
    cos, sin = decoder.rope_cos[:seq], decoder.rope_sin[:seq]
    cache = decoder.new_cache(seq, torch.float32)
    for layer in decoder.model.layers[:split]:
        x = layer(x, cos, sin, cache, 0, None)
    return x


def add_frozen_hidden(decoder: Decoder, split: int, data: dict[str, torch.Tensor], directory: Path,
                      progress: bool = False, precision: str = "float32") -> dict[str, torch.Tensor]:
    """``data`` (feature shards' rows) plus ``draft_hidden [N, T, hidden]`` (float16), computed once
    and kept in ``directory`` (keyed by the split, row count and precision) so a resumed run reads
    them back. ``precision``: the frozen layers' matmuls (:func:`~specdec.train.precision.mixed_precision`,
    the training's own): in float32 this pass took ~25 minutes of a 2-hour budget on an AMX Xeon
    (3 059 sequences of 256 tokens through 22 layers of the 0.5B draft, ~2 sequences/s)."""
    from safetensors.torch import load_file
    from tqdm import tqdm

    from specdec.train.precision import mixed_precision

    rows, longest = data["tokens"].shape
    suffix = "" if precision == "float32" else f"-{precision}"
    path = Path(directory) / f"draft-hidden-split{split}-rows{rows}{suffix}.safetensors"
    if path.is_file():
        return dict(data, draft_hidden=load_file(str(path))["draft_hidden"])
    hidden = torch.zeros(rows, longest, decoder.config.hidden_size, dtype=torch.float16)
    with mixed_precision(precision, decoder.device.type):
        for row in tqdm(range(rows), desc=f"draft layers 0-{split - 1} → {path.parent.name}", unit="seq", disable=not progress):
            length = int((data["tokens"][row] >= 0).sum())
            hidden[row, :length] = frozen_hidden(decoder, split, data["tokens"][row, :length].tolist()).half()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors({"draft_hidden": hidden}, path)
    return dict(data, draft_hidden=hidden)


def divergence_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor, divergence: str) -> torch.Tensor:
    """Mean over rows of KL(p‖q) or ½Σ|p − q|, p = softmax(target_logits), q = softmax(draft_logits);
    ``draft_logits``, ``target_logits``: ``[T, vocab]``. (``greedy`` needs token ids: :func:`greedy_loss`.)"""
    target_log_probs = torch.log_softmax(target_logits.float(), dim=-1)
    draft_log_probs = torch.log_softmax(draft_logits.float(), dim=-1)
    if divergence == "kl":
        return (target_log_probs.exp() * (target_log_probs - draft_log_probs)).sum(-1).mean()
    if divergence == "tvd":
        return 0.5 * (target_log_probs.exp() - draft_log_probs.exp()).abs().sum(-1).mean()
    raise SpecdecError(f"unknown divergence {divergence!r}; available: kl, tvd")


def greedy_loss(draft_logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """Mean over rows of −log q(target's greedy token): ``draft_logits [T, vocab]``, ``target_ids [T]``."""
    return F.cross_entropy(draft_logits.float(), target_ids.long())


def distill_row_loss(tail: DraftTail, parts: TargetParts, divergence: str) -> RowLoss:
    """One sequence: the draft's next-token distribution at every position against the target's
    (from its recorded feature there), or for ``greedy`` against its greedy token; ``top1``: the
    draft's argmax is the target's greedy token (greedy acceptance, teacher-forced)."""

    def row_loss(data: dict[str, torch.Tensor], row: int, generator: torch.Generator | None) -> tuple[torch.Tensor, dict]:
        one = data_row(data, row, parts.device)
        length = int((one["tokens"] >= 0).sum())
        logits = tail(one["draft_hidden"][:length].float())
        greedy_ids = one["target_ids"][:length].long()
        if divergence == "greedy":
            loss = greedy_loss(logits, greedy_ids)
        else:
            with torch.no_grad():
                target_logits = parts.logits(one["features"][:length].float())
            loss = divergence_loss(logits, target_logits, divergence)
        top1 = float((logits.argmax(-1) == greedy_ids).float().mean())
        return loss, {"tokens": length, "top1": top1, "top1_steps": [top1]}

    return row_loss


def save_draft(decoder: Decoder, tokenizer, directory: Path, training: dict) -> Path:  # noqa: ANN001 - Tokenizer
    """``decoder`` as a model directory ``--draft-model`` loads: HF ``config.json``, float32
    ``model.safetensors`` (HF tensor names), the tokenizer, and ``distill.json`` (how it was made)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().float().cpu().contiguous() for name, tensor in decoder.state_dict().items()
             if name not in ("rope_cos", "rope_sin")}
    if decoder.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    write_safetensors(state, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(decoder.config.to_hf_dict(), indent=2) + "\n")
    tokenizer.hf.save_pretrained(str(directory))
    (directory / "distill.json").write_text(json.dumps(training, indent=1) + "\n")
    return directory


def check_job(model: str, draft_model: str, trainable_layers: int, divergence: str) -> None:
    """Refuse a distillation that cannot run before any minute is spent extracting features: the
    pair's configs only (no weights read)."""
    from specdec.models.registry import resolve_model
    from specdec.models.weights import read_config

    if divergence not in DIVERGENCES:
        raise SpecdecError(f"--divergence {divergence!r}: choose one of {', '.join(DIVERGENCES)}")
    target_cfg = read_config(resolve_model(str(model), auto_pull=True))
    draft_cfg = read_config(resolve_model(str(draft_model), auto_pull=True))
    check_pair(target_cfg.vocab_size, draft_cfg.vocab_size, draft_model)
    if not 1 <= trainable_layers <= draft_cfg.num_layers:
        raise SpecdecError(f"--trainable-layers must be between 1 and the draft's {draft_cfg.num_layers} layers, "
                           f"got {trainable_layers}")


def check_pair(target_vocab: int, draft_vocab: int, draft_name: str) -> None:
    if target_vocab != draft_vocab:
        raise SpecdecError(f"the draft {draft_name} (--draft-model; its default is the built-in pair's draft) has a vocabulary "
                           f"of {draft_vocab} ids, the target {target_vocab}: distillation compares their distributions id by "
                           "id, so give --draft-model a draft of the target's tokenizer")
