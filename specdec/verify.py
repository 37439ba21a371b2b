"""All acceptance math. Works on token ids and probabilities only: imports no model, no drafter.

* greedy: accept the longest prefix equal to the target's argmax, then the target's token;
* sampling: modified rejection sampling (Leviathan et al. 2023; Chen et al. 2023) — accept d_i with
  probability min(1, p_i(d_i)/q_i(d_i)); at the first rejection sample from norm(max(p_i − q_i, 0));
  if all k are accepted, sample the bonus token from p_{k+1}. The committed tokens are then
  distributed exactly as the target's own samples;
* deterministic proposals (``q`` is a point mass): accept with probability p_i(d_i); the residual is
  p_i with d_i removed, renormalised.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.sampling import SamplingParams, logits_to_probs, sample_from_probs


def greedy_verify(draft_tokens: Sequence[int] | torch.Tensor, target_argmax: torch.Tensor) -> tuple[int, int]:
    """``target_argmax [k+1]``: accept while draft == argmax; return (n_accepted, next_token)."""
    targets = target_argmax.tolist()
    drafts = draft_tokens.tolist() if isinstance(draft_tokens, torch.Tensor) else list(draft_tokens)
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return accepted, int(targets[accepted])


def _residual(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """norm(max(p − q, 0)); q=None is a point mass on ``token``. Falls back to p if nothing is left."""
    if q is None:
        residual = p.clone()
        residual[token] = 0.0
    else:
        residual = torch.clamp(p - q, min=0.0)
    total = residual.sum()
    return residual / total if total > 0 else p


def rejection_sample(
    draft_tokens: Sequence[int] | torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Chain rejection sampling; ``target_probs [k+1, V]``, ``draft_probs [k, V]`` or None."""
    tokens = torch.as_tensor(draft_tokens, dtype=torch.long, device=target_probs.device).reshape(-1)
    k = tokens.numel()
    if k == 0:
        return 0, sample_from_probs(target_probs[0], generator)
    rows = torch.arange(k, device=target_probs.device)
    p_draft = target_probs[rows, tokens]
    if draft_probs is None:
        ratio = p_draft
    else:
        q_draft = draft_probs[rows, tokens]
        ratio = torch.where(q_draft > 0, p_draft / q_draft.clamp_min(1e-30), torch.zeros_like(p_draft))
    uniforms = torch.rand(k, generator=generator, device=target_probs.device)
    rejected = (uniforms >= ratio.clamp(max=1.0)).nonzero()
    if rejected.numel() == 0:
        return k, sample_from_probs(target_probs[k], generator)
    first = int(rejected[0])
    q_row = None if draft_probs is None else draft_probs[first]
    return first, sample_from_probs(_residual(target_probs[first], q_row, int(tokens[first])), generator)


def verify(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Verify a draft against the target's ``[k+1, V]`` logits (k = len(draft_tokens)).

    ``draft_probs`` must come from :func:`specdec.sampling.logits_to_probs` with the same params; it
    is ignored under greedy, where acceptance is exact token match with the target's argmax.
    """
    if params.is_greedy:
        return greedy_verify(draft_tokens, target_logits.argmax(dim=-1))
    return rejection_sample(draft_tokens, draft_probs, logits_to_probs(target_logits, params), generator)
