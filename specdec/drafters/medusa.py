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
from specdec.drafters.base import Draft, Drafter, DrafterResources, MethodInfo
from specdec.drafters.draft_model import draft_steps, full_vocab, usable_vocab_limit
from specdec.errors import SpecdecError
from specdec.models.heads import MedusaHeads, trained_head
from specdec.models.kv_cache import KVCache
from specdec.sampling import SamplingParams
from specdec.structured import GrammarConstraint


class MedusaDrafter(Drafter):
    """One request's Medusa drafting (see module doc)."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads, target: TorchBackend, params: SamplingParams, generator: torch.Generator,
                 constraint: GrammarConstraint | None = None) -> None:
        self.heads = heads
        self.decoder = target.decoder
        self.vocab_size = target.config.vocab_size
        self.vocab_limit = usable_vocab_limit(heads.config.draft_vocab_size, self.vocab_size)
        self.params = params
        self.generator = generator
        self.constraint = constraint
        self.target_state: KVCache | None = None
        self.model_forwards = 0

    @property
    def weight_bytes(self) -> int:
        """The blocks' bytes plus one pass over the LM head rows per block (each scores its own row)."""
        rows = self.decoder.head_rows(self.vocab_limit) if self.vocab_limit else self.decoder.lm_head
        if isinstance(rows, torch.nn.Module):
            head_rows = sum(t.numel() * t.element_size() for t in [*rows.parameters(), *rows.buffers()])
        else:
            head_rows = self.vocab_limit * self.decoder.config.hidden_size * self.decoder.lm_head.weight.element_size()
        return self.heads.weight_bytes + len(self.heads.blocks) * head_rows

    def bind_target_state(self, state: object) -> None:
        if not isinstance(state, KVCache):
            raise SpecdecError("medusa reads the target's features: it needs specdec's torch backend")
        state.record_features(self.decoder.config.hidden_size)
        self.target_state = state

    def start(self, prompt_ids: list[int]) -> None:
        self.model_forwards = 0

    @torch.inference_mode()
    def propose(self, context_ids: list[int], k: int) -> Draft:
        state = self.target_state
        if state is None or state.features is None:
            raise RuntimeError("MedusaDrafter needs the target's cache: the engine calls bind_target_state() before prefill")
        committed = len(context_ids) - 1
        if state.seq_len != committed or committed < 1:
            raise RuntimeError(f"target cache holds {state.seq_len} positions, expected {committed}")
        k = min(k, len(self.heads.blocks))
        if k <= 0:
            return Draft(tokens=[])
        normed = self.decoder.model.norm(state.features[committed - 1 : committed])
        scorer = self.decoder.head_rows(self.vocab_limit) if self.vocab_limit else self.decoder.lm_head
        hidden = self.heads(normed.to(torch.float32))[:k, 0]  # [k, hidden]
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
    if not isinstance(res.target_backend, TorchBackend):
        raise SpecdecError("medusa reads the target's features: it needs specdec's torch backend")
    if not res.spec.drafter_path:
        raise SpecdecError("medusa needs trained heads: --drafter-path DIR (train them with `specdec train-drafter --kind medusa`)")
    heads = trained_head(res.target_backend.decoder, res.spec.drafter_path, "medusa")
    return MedusaDrafter(heads, res.target_backend, res.params, res.generator, res.constraint)


METHODS = (MethodInfo("medusa", make_medusa_drafter,
                      "K heads on the target's last hidden state propose K tokens at once (Medusa; train with `specdec train-drafter`)",
                      aliases=("mtp",), needs_torch_backend=True, options=("num_speculative_tokens", "drafter_path")),)
