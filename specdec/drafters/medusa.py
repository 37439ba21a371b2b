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

Token trees (``--spec-tree``, Medusa's own "tree attention" candidates): every node at depth d takes
its children from block d+1's distribution — the blocks never see the drafted tokens, so all nodes of
a level share one distribution and branching costs no draft work at all. The tree grows like every
other drafter's (:func:`~specdec.drafters.model_steps.grow_tree`: children valued by the product of
probabilities along their path, the likeliest expanded), and the engine keeps the nodes that pay for
their verification.
"""

from __future__ import annotations

from typing import Generator

import torch

from specdec.backends.torch_backend import TorchBackend
from specdec.calls import ModelCall, run_now
from specdec.drafters.base import Draft, DrafterResources, MethodInfo, model_tree_nodes_for
from specdec.drafters.model_steps import draft_steps, grow_tree, ranking_probs
from specdec.drafters.features import FeatureDrafter, head_for
from specdec.drafters.vocab import DraftVocab
from specdec.models.heads import MedusaHeads
from specdec.penalties import Penalties, penalty_shape
from specdec.sampling import SamplingParams
from specdec.structured import GrammarConstraint
from specdec.tree import depths

#: nodes of a level whose children a tree lists: free here (every level's distribution is computed
#: already), so wider than EAGLE's; the engine's verification budget decides how many nodes are kept
MEDUSA_TREE_WIDTH = 8


class MedusaDrafter(FeatureDrafter):
    """One request's Medusa drafting (see module doc)."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads, target: TorchBackend, params: SamplingParams, generator: torch.Generator,
                 constraint: GrammarConstraint | None = None, tree_nodes: int = 0,
                 stop_ids: frozenset[int] = frozenset()) -> None:
        super().__init__(heads, target)
        self.stop_ids = stop_ids  # the request's stop tokens: min_tokens bans them from q as from p
        self.heads: MedusaHeads = heads
        self.params = params
        self.generator = generator
        self.constraint = constraint
        self.penalties: Penalties | None = None  # the request's logit bias and penalties (set by start)
        self.tree_nodes = tree_nodes  # > 0: propose token trees (see module doc); 0: chains

    @property
    def weight_bytes(self) -> int:
        """The blocks' bytes plus one pass over the LM head rows per block (each scores its own row)."""
        return self.heads.weight_bytes + len(self.heads.blocks) * self.head_rows_bytes()

    def start(self, prompt_ids: list[int]) -> None:
        self.penalties = Penalties.build(self.params, prompt_ids, self.heads.config.vocab_size, self.stop_ids, strict=False)
        self.model_forwards = 0

    @torch.inference_mode()
    def propose(self, context_ids: list[int], k: int) -> Draft:
        state = self.committed_features(context_ids)
        committed = len(context_ids) - 1
        k = min(k, len(self.heads.blocks))
        if k <= 0:
            return Draft(tokens=[])
        normed = self.decoder.model.norm(state.features[committed - 1 : committed])  # (the final layer's alone)
        scorer = self.scorer()
        hidden = self.heads(normed.to(torch.float32))[:k, 0].to(self.decoder.float_dtype)  # [k, hidden]
        rows = list(scorer(hidden).float())  # [k][N]: each block's logits over the vocab's rows
        self.model_forwards += 1
        if self.tree_nodes:
            return run_now(head_tree([ranking_probs(row, self.params) for row in rows], k, self.vocab))
        position = 0

        def step(token: int) -> Generator[ModelCall, torch.Tensor, torch.Tensor]:
            nonlocal position
            position += 1
            return rows[position]
            yield  # the rows are computed already: a generator that yields nothing  # noqa: unreachable

        return run_now(draft_steps(rows[0], step, k, self.params, self.generator, 0.0, None, self.constraint, self.vocab,
                                   penalty_shape(self.penalties, context_ids), len(context_ids)))


def head_tree(level_probs: list[torch.Tensor], depth: int, vocab: DraftVocab | None = None) -> Generator[ModelCall, torch.Tensor, Draft]:
    """A token tree up to ``depth`` deep from per-level distributions ``level_probs [depth][vocab]``
    that do not depend on the drafted tokens (Medusa's blocks): a node at depth d (1 = a child of the
    root) branches into level d's distribution (over ``vocab``'s rows where given). No model call: the
    blocks ran once for the round."""

    def forward(expand: list[int], tokens: list[int], parents: list[int]) -> Generator[ModelCall, torch.Tensor, list[torch.Tensor]]:
        depth_of = depths(parents)
        return [level_probs[depth_of[node]] for node in expand]
        yield  # computed already: a generator that yields nothing  # noqa: unreachable

    return (yield from grow_tree(level_probs[0], depth, MEDUSA_TREE_WIDTH, forward, vocab))


def make_medusa_drafter(res: DrafterResources) -> MedusaDrafter:
    heads = head_for(res, "medusa")
    return MedusaDrafter(heads, res.target_backend, res.params, res.generator, res.constraint, model_tree_nodes_for(res),
                         res.stop_ids)


METHODS = (MethodInfo("medusa", make_medusa_drafter,
                      "K heads on the target's last hidden state propose K tokens at once (Medusa; train with `specdec train-drafter`)",
                      aliases=("mtp",), needs_torch_backend=True,
                      options=("num_speculative_tokens", "drafter_path", "spec_tree"), requires=("drafter_path",)),)
