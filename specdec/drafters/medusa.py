"""Medusa: K heads on the target's last hidden state propose the next K tokens at once (Cai et al. 2024).

The target's cache of the request keeps its final hidden states (:meth:`KVCache.record_features`,
asked in :meth:`bind_target_state` before the prefill). At a proposal the last cached position's
feature — the one whose LM head output was the newest committed token — goes through the
target's final norm and each block k, then the target's LM head rows: block k proposes the token
k+1 positions after the newest one. One round costs K small matrix-vector products and K scorings
by the LM head rows, no autoregressive steps.

Exact like every drafter: under sampling each token is drawn from its block's distribution q_k
(after the request's sampling transform), which is what rejection sampling needs — q may ignore
the earlier drafted tokens, it only has to be the distribution the token came from.
"""

from __future__ import annotations

from typing import Generator

import torch

from specdec.backends.torch_backend import TorchBackend
from specdec.calls import ModelCall, run_now
from specdec.drafters.base import Draft, DrafterResources, MethodInfo
from specdec.drafters.draft_model import draft_steps, full_vocab
from specdec.drafters.features import FeatureDrafter, head_for
from specdec.models.heads import MedusaHeads
from specdec.sampling import SamplingParams
from specdec.structured import GrammarConstraint


class MedusaDrafter(FeatureDrafter):
    """One request's Medusa drafting (see module doc)."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads, target: TorchBackend, params: SamplingParams, generator: torch.Generator,
                 constraint: GrammarConstraint | None = None) -> None:
        super().__init__(heads, target)
        self.heads: MedusaHeads = heads
        self.params = params
        self.generator = generator
        self.constraint = constraint

    @property
    def weight_bytes(self) -> int:
        """The blocks' bytes plus one pass over the LM head rows per block (each scores its own row)."""
        return self.heads.weight_bytes + len(self.heads.blocks) * self.head_rows_bytes()

    def start(self, prompt_ids: list[int]) -> None:
        self.model_forwards = 0

    @torch.inference_mode()
    def propose(self, context_ids: list[int], k: int) -> Draft:
        state = self.committed_features(context_ids)
        committed = len(context_ids) - 1
        k = min(k, len(self.heads.blocks))
        if k <= 0:
            return Draft(tokens=[])
        normed = self.decoder.model.norm(state.features[committed - 1 : committed])
        scorer = self.scorer()
        hidden = self.heads(normed.to(torch.float32))[:k, 0].to(self.decoder.float_dtype)  # [k, hidden]
        rows = [full_vocab(logits, self.vocab_size, self.params.is_greedy) for logits in scorer(hidden).float()]
        self.model_forwards += 1
        position = 0

        def step(token: int) -> Generator[ModelCall, torch.Tensor, torch.Tensor]:
            nonlocal position
            position += 1
            return rows[position]
            yield  # the rows are computed already: a generator that yields nothing  # noqa: unreachable

        return run_now(draft_steps(rows[0], step, k, self.params, self.generator, 0.0, None, self.constraint))


def make_medusa_drafter(res: DrafterResources) -> MedusaDrafter:
    heads = head_for(res, "medusa")
    return MedusaDrafter(heads, res.target_backend, res.params, res.generator, res.constraint)


METHODS = (MethodInfo("medusa", make_medusa_drafter,
                      "K heads on the target's last hidden state propose K tokens at once (Medusa; train with `specdec train-drafter`)",
                      aliases=("mtp",), needs_torch_backend=True, options=("num_speculative_tokens", "drafter_path")),)
