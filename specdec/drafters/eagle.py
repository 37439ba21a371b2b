"""EAGLE: drafting from the target's own features with a one-layer head (Li et al. 2024).

The head (:class:`specdec.models.heads.EagleHead`) reads, at each committed position ``i``, the
target's final hidden state ``f_i`` (an EAGLE-3 head: a low, a middle and the final layer's, fused
into one) and the next token ``x_{i+1}``, and predicts ``f_{i+1}``; the
target's final norm and LM head (its first ``draft_vocab_size`` rows) score the token after. Then it
drafts on its own predicted features, one head step per token.

Where the features come from: the drafter asks the target's cache of its request to keep them
(:meth:`KVCache.record_features`, in :meth:`bind_target_state`, before the prefill), so the
target's prefill and every verification pass store the features of the positions they compute,
slot by slot — the engine's truncate (chains) and keep (trees) then leave exactly the committed
positions' features, and the drafter needs no bookkeeping of what was accepted. Its own cache holds
one entry per committed position it has read (cut back to those before each proposal: drafted
positions were computed from predicted features).

Exactness does not depend on the head: it only proposes; the engine verifies (greedy: identity;
sampling: q is the head's distribution after the request's sampling transform).
"""

from __future__ import annotations

from typing import Generator

import torch

from specdec.backends.torch_backend import TorchBackend
from specdec.calls import ModelCall, run_now
from specdec.drafters.base import Draft, DrafterResources, MethodInfo, model_tree_nodes_for
from specdec.drafters.model_steps import draft_steps, grow_tree, ranking_probs
from specdec.drafters.eagle_graph import EagleStepGraph
from specdec.drafters.features import FeatureDrafter, head_for
from specdec.models.heads import EagleHead
from specdec.penalties import Penalties, penalty_shape
from specdec.sampling import SamplingParams
from specdec.structured import GrammarConstraint
from specdec.tree import TreeLayout

#: head rows forwarded per tree level: the head is ~1/20 of a target step, so a few rows cost
#: about one (its LM-head rows are the bulk, read once per level whatever the row count)
EAGLE_TREE_WIDTH = 4


class EagleDrafter(FeatureDrafter):
    """One request's EAGLE drafting (see module doc)."""

    name = "eagle"

    def __init__(self, head: EagleHead, target: TorchBackend, params: SamplingParams, generator: torch.Generator,
                 max_seq_len: int, context_window: int = 0, confidence_threshold: float = 0.0,
                 constraint: GrammarConstraint | None = None, tree_nodes: int = 0,
                 stop_ids: frozenset[int] = frozenset()) -> None:
        super().__init__(head, target)
        self.stop_ids = stop_ids  # the request's stop tokens: min_tokens bans them from q as from p
        self.head: EagleHead = head
        self.params = params
        self.generator = generator
        self.context_window = context_window  # read at most the last N prompt positions (0: all)
        self.confidence_threshold = confidence_threshold
        self.constraint = constraint
        self.penalties: Penalties | None = None  # the request's logit bias and penalties (set by start)
        #: > 0: grow token trees (:meth:`_propose_tree`); 0: chains
        self.tree_nodes = tree_nodes
        # a tree's region beyond the chain's room: EAGLE_TREE_WIDTH head rows per level
        self.cache = head.new_cache(max_seq_len + EAGLE_TREE_WIDTH * tree_nodes)
        self.first = 0  # position of the head cache's slot 0
        #: chain steps replayed as a CUDA graph where the target replays its own (eagle_graph.py)
        self.step_graph = (EagleStepGraph(head, self.decoder, self.scorer(), self.cache)
                           if target.graphs is not None else None)
        self.read = 0  # committed positions in the head cache (from ``first``)

    @property
    def weight_bytes(self) -> int:
        """The head's bytes plus the target LM head rows it scores with, per draft step."""
        return self.head.weight_bytes + self.head_rows_bytes()

    def start(self, prompt_ids: list[int]) -> None:
        self.penalties = Penalties.build(self.params, prompt_ids, self.head.config.vocab_size, self.stop_ids, strict=False)
        self.cache.truncate(0)
        self.read = 0
        # pair i reads f_i and x_{i+1}: the prompt's pairs are 0 .. len-1 once the first token is out
        self.first = max(0, len(prompt_ids) - self.context_window) if self.context_window else 0
        self.model_forwards = 0

    def _scores(self, predicted: torch.Tensor) -> torch.Tensor:
        """``predicted [1, hidden]`` feature → draft logits over the :attr:`vocab`'s rows ``[N]``."""
        return self._score_rows(predicted)[-1]

    def _score_rows(self, predicted: torch.Tensor) -> list[torch.Tensor]:
        """``predicted [R, hidden]`` features → R rows of draft logits ``[N]``, scored in one LM-head pass."""
        normed = self.decoder.model.norm(predicted.to(self.decoder.float_dtype))
        return list(self.scorer()(normed).float())

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor(tokens, dtype=torch.long, device=self.decoder.device)
        return self.decoder.model.embed_tokens(ids).to(self.head.rope_cos.dtype)

    @torch.inference_mode()
    def propose(self, context_ids: list[int], k: int) -> Draft:
        state = self.committed_features(context_ids)
        committed = len(context_ids) - 1  # the target cache's positions; x_{n-1} is its next input
        k = max(0, min(k, self.cache.max_seq_len - (committed - self.first)))
        if k == 0:
            return Draft(tokens=[])
        self.cache.truncate(self.read)  # forget last round's drafted positions
        begin = self.first + self.read
        positions = torch.arange(begin, committed, device=self.decoder.device)
        features = self.head.target_feature(state.features[begin:committed].to(self.head.rope_cos.dtype))
        predicted = self.head(features, self._embed(context_ids[begin + 1 : committed + 1]), positions, self.cache)[-1:]
        self.read = committed - self.first
        self.model_forwards += 1
        if self.tree_nodes:
            return run_now(self._propose_tree(predicted, k))
        position = committed

        def step(token: int) -> Generator[ModelCall, torch.Tensor, torch.Tensor]:
            nonlocal predicted, position
            self.model_forwards += 1
            if self.step_graph is not None:
                predicted, logits = self.step_graph.step(predicted, token, position)
                position += 1
                return logits[-1]
            predicted = self.head(predicted, self._embed([token]), torch.tensor([position], device=self.decoder.device), self.cache)
            position += 1
            return self._scores(predicted)
            yield  # runs at once: a generator that yields nothing  # noqa: unreachable

        return run_now(draft_steps(self._scores(predicted), step, k, self.params, self.generator,
                                   self.confidence_threshold, None, self.constraint, self.vocab,
                                   penalty_shape(self.penalties, context_ids), len(context_ids)))

    def _propose_tree(self, predicted: torch.Tensor, depth: int) -> Generator[ModelCall, torch.Tensor, Draft]:
        """A token tree up to ``depth`` deep (:func:`~specdec.drafters.model_steps.grow_tree`): each
        level's expanded nodes go through the head together, each reading its parent's predicted
        feature and attending to the committed positions and its own ancestors (a tree region of
        the head's cache, forgotten next round like a chain's drafted positions)."""
        base = self.cache.seq_len
        region: list[int] = []
        slot_of: dict[int, int] = {}
        feature_of: dict[int, torch.Tensor] = {}  # expanded node → the feature its pair predicted
        device = self.decoder.device

        def forward(expand: list[int], tokens: list[int], parents: list[int]) -> Generator[ModelCall, torch.Tensor, list[torch.Tensor] | None]:
            if self.cache.seq_len + len(expand) > self.cache.max_seq_len:
                return None
            for node in expand:
                slot_of[node] = len(region)
                region.append(-1 if parents[node] < 0 else slot_of[parents[node]])
            layout = TreeLayout(base, list(region))
            inputs = torch.cat([predicted if parents[n] < 0 else feature_of[parents[n]] for n in expand])
            out = self.head(inputs, self._embed([tokens[n] for n in expand]), layout.positions(len(expand), device) + self.first,
                            self.cache, layout.mask(len(expand), device))
            self.model_forwards += 1
            feature_of.update({node: out[i : i + 1] for i, node in enumerate(expand)})
            return [ranking_probs(row, self.params) for row in self._score_rows(out)]
            yield  # runs at once: a generator that yields nothing  # noqa: unreachable

        return (yield from grow_tree(ranking_probs(self._scores(predicted), self.params), depth, EAGLE_TREE_WIDTH, forward,
                                     self.vocab))

    def finish(self) -> None:
        self.cache.truncate(0)
        self.read = 0


def make_eagle_drafter(res: DrafterResources) -> EagleDrafter:
    head = head_for(res, "eagle")
    spec = res.spec
    threshold = spec.draft_confidence_threshold if spec.adaptive else 0.0
    return EagleDrafter(head, res.target_backend, res.params, res.generator, res.max_seq_len,
                        spec.draft_context_window, threshold, res.constraint, model_tree_nodes_for(res), res.stop_ids)


METHODS = (MethodInfo("eagle", make_eagle_drafter,
                      "a one-layer head on the target's own features drafts (EAGLE; train it with `specdec train-drafter`)",
                      needs_torch_backend=True,
                      options=("num_speculative_tokens", "drafter_path", "draft_context_window", "draft_confidence_threshold",
                               "spec_tree"), requires=("drafter_path",)),)
