"""All acceptance math (ARCHITECTURE principle 3). Token ids and probabilities only: no model, no drafter.

* **greedy**: accept the longest prefix of the draft equal to the target's argmax, then emit the
  target's own argmax at the first mismatch (or the bonus token after a full accept). The output is
  token-for-token that of plain greedy decoding.
* **sampling**: modified rejection sampling (Leviathan et al. 2023; Chen et al. 2023). Accept d_i
  with probability min(1, p_i(d_i)/q_i(d_i)); at the first rejection emit a sample of
  norm(max(p_i − q_i, 0)); if all k are accepted, emit a bonus sample of p_k. Every committed token
  is then distributed exactly as a sample of the target (given the tokens before it).
* **deterministic proposals** (``draft_probs is None``: prompt lookup, suffix, retrieval …) are the
  same rule with q_i a point mass on d_i: accept with probability p_i(d_i); the residual
  max(p_i − onehot(d_i), 0) is p_i with d_i removed.

* **trees** (:func:`verify_tree`): several candidate tokens per position, each a deterministic
  proposal (q a point mass). Greedy follows the child equal to the target's argmax. Sampling tries
  the children in order against a residual r (initially p): accept child x with probability
  r(x)/Σr, else zero r(x) and try the next sibling; when every child is rejected, emit a sample of
  r. That is the point-mass case of recursive rejection sampling (SpecInfer; Jeon et al. 2024) and
  exact for any set of distinct candidates chosen without looking at the target: P(emit y) = p(y)
  whatever the tree (the first sibling is taken with p(x₁), the second with p(x₂)/(1 − p(x₁)) of
  the remaining mass, …). A child *sampled* from q (``node_probs``: the first child of each node
  of a sampled chain with alternatives, :mod:`specdec.alternatives`) takes the chain's rule
  instead — accept with min(1, r(x)/q(x)), else r ← max(r − q, 0) — and the point-mass siblings
  after it are tried on that residual: each rule samples exactly from its r, so the mix is exact,
  provided whether a sampled child is verified never depends on the token drawn (a drafter that
  reranked sampled children by their probability would bias them).

Both p and q must come from :func:`specdec.sampling.logits_to_probs` with the same params.

The batched form (``[B, k]``) is the reference implementation; the single-sequence functions call it
with B = 1, and the χ² tests run it on tens of thousands of trials at once. On a CPU the engine's path,
:func:`rejection_sample_rows`, transforms only the rows it reaches, with the same draws and decisions
(tested seed by seed against the batched form), so the χ² tests certify it too.
* **seeded sampling** (a request with a seed, given its position): the token at each position is the
  one plain decoding takes with that seed, whatever was drafted (:mod:`specdec.seeded`).

Randomness per sequence: one ``torch.rand(k)`` for the k accept tests (drawn even for positions after
the first rejection, so the stream consumed depends only on k), then one uniform for the emitted token.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.sampling import SamplingParams, greedy_ids, logits_to_probs, sample_rows
from specdec.seeded import seeded_tree_walk, seeded_verify
from specdec.tree import check_parents, children


def greedy_verify(draft_tokens: Sequence[int] | torch.Tensor, target_argmax: torch.Tensor) -> tuple[int, int]:
    """``draft_tokens [k]``, ``target_argmax [k+1]`` → ``(n_accepted, next_token)``.

    ``next_token = target_argmax[n_accepted]``: the correction at the first mismatch, or the bonus
    token when all k match. One vectorised compare and one device→host transfer.
    """
    k = target_argmax.shape[-1] - 1
    drafts = torch.as_tensor(draft_tokens, dtype=torch.long, device=target_argmax.device).reshape(-1)
    if drafts.numel() != k:
        raise ValueError(f"greedy_verify: {drafts.numel()} draft tokens need {drafts.numel() + 1} target rows, got {k + 1}")
    n_accepted = (drafts == target_argmax[:k]).long().cumprod(0).sum().reshape(1)
    next_token = target_argmax.long().gather(0, n_accepted)
    n, token = torch.cat([n_accepted, next_token]).tolist()
    return n, token


def _residual(p: torch.Tensor, q: torch.Tensor | None, token: torch.Tensor) -> torch.Tensor:
    """max(p − q, 0) row-wise (``[B, V]``; q None = point mass on ``token [B]``), unnormalised.

    Where nothing is left (p ≤ q everywhere, i.e. p == q up to rounding, so a rejection had
    probability ~0) fall back to p. No division: :func:`sample_rows` normalises by the row total.
    """
    if q is None:
        residual = p.scatter(-1, token.unsqueeze(-1), 0.0)
    else:
        residual = (p - q).clamp_min(0.0)
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)


def rejection_sample_batch(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain rejection sampling for B independent sequences.

    ``draft_tokens [B, k]``; ``draft_probs [B, k, V]`` or None (point-mass q);
    ``target_probs [B, k+1, V]``. Returns LongTensors ``n_accepted [B]`` and ``next_token [B]``.
    """
    batch, k = draft_tokens.shape
    device = target_probs.device
    if target_probs.shape[:2] != (batch, k + 1):
        raise ValueError(f"target_probs must be [B, k+1, V] = [{batch}, {k + 1}, V], got {list(target_probs.shape)}")
    if draft_probs is not None and draft_probs.shape[:2] != (batch, k):
        raise ValueError(f"draft_probs must be [B, k, V] = [{batch}, {k}, V], got {list(draft_probs.shape)}")
    if k == 0:
        return torch.zeros(batch, dtype=torch.long, device=device), sample_rows(target_probs[:, 0], generator)

    tokens = draft_tokens.to(device=device, dtype=torch.long)
    p_draft = target_probs[:, :k].gather(-1, tokens.unsqueeze(-1)).squeeze(-1).double()
    if draft_probs is None:
        ratio = p_draft
    else:
        q_draft = draft_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).double()
        # q(d) == 0 cannot happen for a token sampled from q; if a drafter breaks that, reject.
        ratio = torch.where(q_draft > 0, p_draft / q_draft.clamp_min(1e-300), 0.0)
    uniforms = torch.rand(batch, k, generator=generator, dtype=torch.float64, device=device)
    n_accepted = (uniforms < ratio).long().cumprod(-1).sum(-1)

    rows = torch.arange(batch, device=device)
    first_rejected = n_accepted.clamp(max=k - 1)
    residual = _residual(
        target_probs[rows, first_rejected],
        None if draft_probs is None else draft_probs[rows, first_rejected],
        tokens[rows, first_rejected],
    )
    all_accepted = (n_accepted == k).unsqueeze(-1)
    emit_from = torch.where(all_accepted, target_probs[:, k], residual)
    return n_accepted, sample_rows(emit_from, generator)


def rejection_sample(
    draft_tokens: Sequence[int] | torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[int, int]:
    """One sequence: ``draft_tokens [k]``, ``draft_probs [k, V]`` or None, ``target_probs [k+1, V]``.

    Returns ``(n_accepted, next_token)``; k == 0 samples ``next_token`` from p_0.
    """
    tokens = torch.as_tensor(draft_tokens, dtype=torch.long, device=target_probs.device).reshape(1, -1)
    n_accepted, next_token = rejection_sample_batch(
        tokens, None if draft_probs is None else draft_probs.unsqueeze(0), target_probs.unsqueeze(0), generator
    )
    n, token = torch.cat([n_accepted, next_token]).tolist()
    return n, token


def verify(
    draft_tokens: Sequence[int] | torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    position: int | None = None,
) -> tuple[int, int]:
    """The engine's entry point: target logits ``[k+1, V]`` → ``(n_accepted, next_token)``.

    Applies :func:`logits_to_probs` to the target rows and dispatches: greedy → exact argmax match
    (``draft_probs`` ignored); seeded sampling with ``position`` (where row 0's token goes in the
    sequence) → the seeded choices plain decoding makes (:mod:`specdec.seeded`); otherwise rejection
    sampling. ``draft_probs`` must already have been produced by ``logits_to_probs`` with the *same*
    params (or be None for a deterministic proposal) — verifying against an untransformed q silently
    changes the output distribution.
    """
    if params.is_greedy:
        return greedy_verify(draft_tokens, greedy_ids(target_logits))
    if params.is_seeded_sampling and position is not None:
        return seeded_verify(torch.as_tensor(draft_tokens, dtype=torch.long).reshape(-1).tolist(), target_logits, params, position)
    if target_logits.device.type != "cpu":  # an accelerator transforms all rows at once for less than a sync per row
        return rejection_sample(draft_tokens, draft_probs, logits_to_probs(target_logits, params), generator)
    return rejection_sample_rows(draft_tokens, draft_probs, target_logits, params, generator)


def rejection_sample_rows(
    draft_tokens: Sequence[int] | torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
) -> tuple[int, int]:
    """:func:`rejection_sample` of ``target_logits [k+1, V]``, transforming only the rows the test
    reaches: row i's probabilities are needed only if tokens 0..i−1 were accepted, and each row's
    :func:`logits_to_probs` (a softmax over the vocabulary, a top-k/top-p search) costs ~0.6 ms at
    152 k ids on one core — for every row after the first rejection, for nothing. The same random
    draws in the same order and the same per-row arithmetic as the batched form (rows never
    interact), so the result is identical to it for a given generator state (tests/test_verify.py)."""
    tokens = torch.as_tensor(draft_tokens, dtype=torch.long).reshape(-1).tolist()
    k = len(tokens)
    if target_logits.shape[0] != k + 1:
        raise ValueError(f"verify: {k} draft tokens need {k + 1} target rows, got {target_logits.shape[0]}")
    if draft_probs is not None and draft_probs.shape[0] != k:
        raise ValueError(f"verify: {k} draft tokens need {k} draft rows, got {draft_probs.shape[0]}")
    # the batched form's one draw for all k accept tests (the stream consumed depends only on k)
    uniforms = torch.rand(1, k, generator=generator, dtype=torch.float64, device=target_logits.device)[0].tolist() if k else []
    for i, token in enumerate(tokens):
        p = logits_to_probs(target_logits[i : i + 1], params)  # [1, V]
        p_token = float(p[0, token])
        if draft_probs is None:
            ratio = p_token
        else:
            q_token = float(draft_probs[i, token])
            ratio = p_token / max(q_token, 1e-300) if q_token > 0 else 0.0  # q(d) == 0: a broken drafter, reject
        if not uniforms[i] < ratio:
            residual = _residual(p, None if draft_probs is None else draft_probs[i : i + 1],
                                 torch.tensor([token], device=p.device))
            return i, int(sample_rows(residual, generator)[0])
    return k, int(sample_rows(logits_to_probs(target_logits[k : k + 1], params), generator)[0])


def verify_tree(
    draft_tokens: Sequence[int],
    parents: Sequence[int],
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    node_probs: Sequence[torch.Tensor | None] | None = None,
    position: int | None = None,
) -> tuple[list[int], int]:
    """Walk a token tree: ``draft_tokens [N]`` with ``parents [N]`` (-1: follows the committed
    tokens), ``target_logits [N+1, V]`` (row 0: after the last committed token; row i+1: after
    node i's path). Returns ``(path, next_token)``: the accepted nodes from the root down, then the
    token the target emits after them (the correction, or the bonus token at a leaf).

    Siblings are tried in index order against what the earlier ones' rejections left of p (see the
    module docstring); they must be distinct (a repeated point mass is never accepted: its mass is
    already gone). Under sampling a node with ``node_probs[i]`` (q ``[V]``) was drawn from q, and is
    accepted with min(1, r(x)/q(x)), leaving max(r − q, 0) to its later siblings — the chain's rule;
    the others are point masses, accepted with r(x), leaving r without x. Either rule samples
    exactly from r, so any mix is exact — provided a sampled node's presence never depended on the
    token drawn (:mod:`specdec.alternatives`)."""
    check_parents(parents, len(draft_tokens))
    if target_logits.shape[0] != len(draft_tokens) + 1:
        raise ValueError(f"verify_tree: {len(draft_tokens)} nodes need {len(draft_tokens) + 1} target rows, "
                         f"got {target_logits.shape[0]}")
    kids = children(parents)
    if params.is_seeded_sampling and position is not None:  # row 0 chooses the token at position
        return seeded_tree_walk(draft_tokens, kids, target_logits, params, position)
    path: list[int] = []
    node, row = -1, 0
    if params.is_greedy:
        best = greedy_ids(target_logits).tolist()
        while True:
            match = next((child for child in kids.get(node, []) if draft_tokens[child] == best[row]), None)
            if match is None:
                return path, best[row]
            path.append(match)
            node, row = match, match + 1
    while True:
        # only the rows the walk visits (len(path) + 1 of N + 1): a tree's other rows cost a
        # vocabulary-wide softmax each for nothing (~0.6 ms a row at 152 k ids on one core)
        target_row = logits_to_probs(target_logits[row], params)
        residual = target_row.double()
        accepted = None
        for child in kids.get(node, []):
            token = draft_tokens[child]
            q = None if node_probs is None else node_probs[child]
            if q is None:  # a point mass: accepted with r(x)
                mass = residual[token] / residual.sum()
            else:  # sampled from q: min(1, r(x)/q(x)); q(x) == 0 cannot happen for a sampled token: reject
                # r(x) as the normalised row's entry would be, without normalising the whole row: a
                # vocabulary-wide division is only needed when the token is rejected (below)
                total = residual.sum()
                q = q.to(residual.device, torch.float64)
                mass = ((residual[token] / total) / q[token]).clamp(max=1.0) if q[token] > 0 else 0.0
            if float(torch.rand((), generator=generator, dtype=torch.float64, device=residual.device)) < mass:
                accepted = child
                break
            if q is None:
                residual[token] = 0.0  # a copy of the row: target_row.double() above
            else:  # the chain's residual max(r − q, 0) (r itself where nothing is left)
                residual = _residual((residual / total)[None], q[None], None)[0]
        if accepted is None:
            if not float(residual.sum()) > 0:  # every candidate together held all of p (rounding)
                residual = target_row.double()
            return path, int(sample_rows(residual, generator))
        path.append(accepted)
        node, row = accepted, accepted + 1
