"""What each head kind learns from a teacher-forced sequence (:mod:`specdec.train.data`).

**EAGLE**: a regression of the next feature (smooth L1, each row scaled by the target feature's
RMS so the model's few huge channels do not drown the rest) plus the cross-entropy of the head's
token distribution against the target's (weighted 1, not EAGLE's 0.1: see
:class:`specdec.train.loop.TrainConfig`), both through the target's frozen final norm and LM head
rows. Input features get a little uniform noise, as in EAGLE: at drafting time the head reads its
own predicted features, which are never exact.

**Medusa**: head k reads the feature at position i and learns the target's distribution k+1
tokens later (the target's own LM head covers the next token), by cross-entropy against the
target's distribution there (self-distillation, Medusa-2 style).

With ``loss_rows`` either token loss scores only a sample of the LM head rows
(:func:`sampled_rows`): those rows' matmuls, forward and backward at every unrolled step or head,
were most of a training step's arithmetic (32768 rows against a 24 M-parameter EAGLE head; Medusa's
blocks are smaller still). On a Zen 4, 10 minutes of EAGLE training on the same data: held-out
top-1 0.277 with 2048 drawn rows (305 steps) vs 0.255 with all rows (185 steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.models.heads import DraftHead, EagleHead, MedusaHeads
from specdec.train.target_parts import TargetParts


#: a sampled token loss always scores each position's this many likeliest rows under the target
SAMPLED_TOP = 8


def head_loss(head: DraftHead, parts: TargetParts, tokens: torch.Tensor, features: torch.Tensor,
              target_ids: torch.Tensor, noise: float, reg_weight: float, cls_weight: float,
              generator: torch.Generator | None = None, unroll_steps: int = 1, step_decay: float = 1.0,
              report_steps: int = 0, loss_rows: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of ``head`` on one sequence (see :func:`eagle_loss` for the arguments)."""
    if isinstance(head, MedusaHeads):
        return medusa_loss(head, parts, tokens, features, target_ids, generator, loss_rows)
    return eagle_loss(head, parts, tokens, features, target_ids, noise, reg_weight, cls_weight, generator, unroll_steps,
                      step_decay, report_steps, loss_rows)


@torch.no_grad()
def sampled_rows(target_logits: torch.Tensor, negatives: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The LM head rows a sampled token loss scores (sampled softmax, Jean et al. 2015), for
    ``target_logits [P, R]``: every position's :data:`SAMPLED_TOP` likeliest rows under the target
    (nearly all of its mass: the soft labels lose almost nothing) and ``negatives`` of the other rows
    drawn uniformly (so every row is pushed down now and then). Returns ``rows [S]`` and
    ``log_inclusion [S]``: the log-probability each row was included with (0 for the target's, log
    n/others for the drawn), which the head's logits subtract so that a softmax over the S rows
    estimates the one over all R."""
    total = target_logits.shape[-1]
    top = torch.topk(target_logits, min(SAMPLED_TOP, total), dim=-1).indices.unique()
    others = torch.ones(total, dtype=torch.bool, device=target_logits.device)
    others[top] = False
    pool = others.nonzero().squeeze(1)
    take = min(negatives, len(pool))
    drawn = pool[torch.randperm(len(pool), generator=generator)[:take].to(pool.device)]
    log_inclusion = torch.zeros(len(top) + take, device=target_logits.device)
    if take:
        log_inclusion[len(top):] = math.log(take / len(pool))
    return torch.cat([top, drawn]), log_inclusion


@dataclass
class TokenTargets:
    """What a head's token loss learns at each position: the target's distribution ``probs [P, S]``
    over the LM head rows the loss scores — all of them (``rows`` None) or :func:`sampled_rows`'
    ``rows [S]`` with their ``log_inclusion [S]`` and their LM head ``weight [S, hidden]``, which the
    head's logits are scored with (``TargetParts.logits(hidden, weight)``)."""

    probs: torch.Tensor
    rows: torch.Tensor | None = None
    log_inclusion: torch.Tensor | None = None
    weight: torch.Tensor | None = None

    @classmethod
    @torch.no_grad()
    def of(cls, parts: TargetParts, target_features: torch.Tensor, loss_rows: int = 0,
           generator: torch.Generator | None = None) -> TokenTargets:
        """From the target's own features ``[P, hidden]`` (pre-norm); ``loss_rows`` > 0 with a
        ``generator`` (training) samples the rows."""
        target_logits = parts.logits(target_features)
        if loss_rows <= 0 or generator is None:
            return cls(torch.softmax(target_logits, dim=-1))
        rows, log_inclusion = sampled_rows(target_logits, loss_rows, generator)
        return cls(torch.softmax(target_logits[:, rows], dim=-1), rows, log_inclusion, parts.cut(rows))

    def best_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's argmax row per position of ``logits [P', S]``, as LM head row indices."""
        best = logits.argmax(-1)
        return best if self.rows is None else self.rows[best]

    def cross_entropy(self, logits: torch.Tensor, start: int) -> torch.Tensor:
        """Mean over positions ``start ..`` of −Σ p·log q: ``logits [P − start, S]`` are the head's."""
        if self.log_inclusion is not None:
            logits = logits - self.log_inclusion
        return -(self.probs[start:] * torch.log_softmax(logits, dim=-1)).sum(-1).mean()


def eagle_loss(head: EagleHead, parts: TargetParts, tokens: torch.Tensor, features: torch.Tensor,
               target_ids: torch.Tensor, noise: float, reg_weight: float, cls_weight: float,
               generator: torch.Generator | None = None, unroll_steps: int = 1, step_decay: float = 1.0,
               report_steps: int = 0, loss_rows: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
    """One sequence: ``tokens [T]`` (-1 past its end), ``features [T, hidden × layers]`` (the target's
    at the head's ``read_layers``, the final one last), ``target_ids [T]`` (the target's greedy next
    token per position). Pair i = (f_i, x_{i+1}) predicts f_{i+1} (the final layer's) and the token
    after it, target_ids[i+1].

    ``unroll_steps`` > 1 is EAGLE-3's training-time test: step s feeds the head its own step s−1
    predictions (f̂_p in place of f_p) and attends as it will when drafting the (s+1)-th token of a
    round (:func:`~specdec.models.heads.unroll_mask`); every step's loss counts equally, gradients
    flow through the chain. Teacher forcing alone (1 step) never shows the head its own errors: the
    first trained head's acceptance fell from 0.24 at draft position 1 to 0.01 at position 2.
    ``top1`` is step 0's teacher-forced agreement; ``top1_steps`` each step's, for
    ``max(unroll_steps, report_steps)`` steps (evaluation reports more steps than the loss counts,
    from the same unrolled pass: earlier steps do not depend on later ones). ``loss_rows`` > 0 (with a
    ``generator``: training) scores the token loss over :func:`sampled_rows` with that many drawn
    rows; its ``top1`` then picks among those rows (evaluation, with no generator, scores all)."""
    length = int((tokens >= 0).sum())
    pairs = length - 1
    hidden = head.config.hidden_size
    f = features[:length].float()
    f_in, f_next = f[:-1], f[1:, -hidden:]
    if noise > 0:  # scaled by each layer's own RMS: a low layer's and the final one's differ
        by_layer = f_in.unflatten(-1, (-1, hidden))
        scale = by_layer.pow(2).mean(-1, keepdim=True).sqrt()
        uniform = torch.rand(by_layer.shape, generator=generator).to(f_in.device)  # a CPU generator: same noise on any device
        f_in = (by_layer + noise * scale * (2 * uniform - 1)).flatten(-2)
    embeds = parts.embed(tokens[1:length])
    rms = f_next.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-6)
    targets = TokenTargets.of(parts, f_next, loss_rows, generator)
    wanted = target_ids[1:length].long()
    total = torch.zeros(())
    reg_sum = cls_sum = 0.0
    top1_steps: list[float] = []
    loss_steps = 0
    for step, predicted in enumerate(head.unroll(f_in, embeds, max(unroll_steps, report_steps))):
        valid = predicted[step:]  # rows p < step have no drafting round behind them
        logits = parts.logits(valid, targets.weight)
        top1_steps.append(float((parts.token_ids(targets.best_rows(logits)) == wanted[step:]).float().mean()))
        if step >= unroll_steps:
            continue
        reg = F.smooth_l1_loss(valid / rms[step:], f_next[step:] / rms[step:])
        cls = targets.cross_entropy(logits, step)
        total = total + step_decay**step * (reg_weight * reg + cls_weight * cls)
        reg_sum += reg.item()
        cls_sum += cls.item()
        loss_steps += 1
    return total / sum(step_decay**step for step in range(loss_steps)), {
        "reg": reg_sum / loss_steps, "cls": cls_sum / loss_steps, "top1": top1_steps[0], "top1_steps": top1_steps,
        "tokens": pairs}


def medusa_loss(head: MedusaHeads, parts: TargetParts, tokens: torch.Tensor, features: torch.Tensor,
                target_ids: torch.Tensor, generator: torch.Generator | None = None,
                loss_rows: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
    """Head k (0-based) at position i predicts the target's token after position i+k+1: its
    distribution there (soft labels from the feature f_{i+k+1}, every head's from one LM head pass);
    ``top1`` is the first head's, ``top1_steps`` each head's. ``loss_rows``, ``generator``: a sampled
    token loss, as :func:`eagle_loss`'s (one sample of rows for all the heads)."""
    length = int((tokens >= 0).sum())
    f = features[:length, -head.config.hidden_size :].float()  # the final layer's (the last recorded)
    normed = parts.norm(f)
    targets = TokenTargets.of(parts, f[1:], loss_rows, generator)  # position j's: row j - 1
    total = torch.zeros(())
    top1_steps: list[float] = []
    for k, block in enumerate(head.blocks):
        shift = k + 1
        if length <= shift:
            break
        logits = parts.normed_logits(block(normed[: length - shift]), targets.weight)
        total = total + targets.cross_entropy(logits, shift - 1)
        top1_steps.append(float((parts.token_ids(targets.best_rows(logits)) == target_ids[shift:length].long()).float().mean()))
    return total / len(head.blocks), {"top1": top1_steps[0] if top1_steps else 0.0, "top1_steps": top1_steps,
                                      "tokens": length - 1}
