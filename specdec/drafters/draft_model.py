"""Drafting with a small model of the same family (Leviathan et al. 2023; Chen et al. 2023).

The draft model has its own KV cache kept in step with the committed tokens: after verification it
is truncated to the accepted prefix, and the correction/bonus token (which it has never seen) is fed
at the start of the next round together with any other pending tokens, so the prefix is never
recomputed.

On a long prompt the draft model reads only its last ``context_window`` tokens: its prompt pass
happens inside the first decode round, and over a 2k-token prompt it cost more than the whole
speculation saved (draft_suffix ran at 0.46× plain decode on Spec-Bench rag). A draft that sees less
context is accepted a little less often, never changes the output.
"""

from __future__ import annotations

from typing import Callable, Generator

import torch

from specdec import step_costs
from specdec.backends.base import Backend
from specdec.calls import ModelCall, run_now
from specdec.cost_model import Curve
from specdec.drafters.base import Draft, Drafter, DrafterResources, MethodInfo, model_tree_nodes_for
from specdec.drafters.model_steps import draft_steps, grow_tree, next_token_steps, ranking_probs, tree_width
from specdec.drafters.vocab import usable_vocab_limit
from specdec.errors import SpecdecError
from specdec.penalties import Penalties, penalty_shape
from specdec.sampling import SamplingParams
from specdec.step_calibration import planning_curve, rescaled
from specdec.structured import GrammarConstraint
from specdec.tree import TreeLayout, path_to

#: a draft forward of at least this many tokens is a prompt pass (the catch-up on a new prompt, or on
#: what was generated while the draft sat out): it runs on the draft's prompt backend
PROMPT_PASS_ROWS = 16


class DraftModelDrafter(Drafter):
    name = "draft_model"

    def __init__(
        self,
        backend: Backend,
        params: SamplingParams,
        generator: torch.Generator,
        max_seq_len: int,
        confidence_threshold: float = 0.0,
        vocab_limit: int | None = None,
        context_window: int = 0,
        constraint: GrammarConstraint | None = None,
        tree_nodes: int = 0,
        stop_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.backend = backend
        self.stop_ids = stop_ids  # the request's stop tokens: min_tokens bans them from q as from p
        #: > 0: grow token trees of up to this many nodes (:meth:`_propose_tree`); 0: chains
        self.tree_nodes = tree_nodes
        self.tree_width = tree_width(backend.step_seconds)  # nodes forwarded per tree level
        #: the last tree's nodes that were forwarded, and their slots in its region (from ``tree_base``)
        self.tree_slots: dict[int, int] = {}
        self.tree_tokens: list[int] = []
        self.tree_base = 0
        #: read at most the last N tokens of a prompt (0 = all of it; see the module docstring)
        self.context_window = context_window
        self.offset = 0  # committed tokens before the draft cache's first position
        #: score only token ids < vocab_limit (see Decoder.head_rows); None = the whole vocabulary
        self.vocab_limit = usable_vocab_limit(vocab_limit, backend.config.vocab_size)
        self.params = params
        self.generator = generator
        self.max_seq_len = max_seq_len
        #: stop a round early once the draft's own top probability drops below this (0 = never)
        self.confidence_threshold = confidence_threshold
        #: optional ``(drafted, room) -> tokens`` asked before each draft step (see draft_steps)
        self.take_over: Callable[[list[int], int], list[int]] | None = None
        self.constraint = constraint  # structured output: the request's grammar (masks q like p)
        self.penalties: Penalties | None = None  # the request's logit bias and penalties (set by start)
        # a tree's region beyond the chain's room: tree_width forwarded nodes per level (a tree
        # stops growing where its cache is full)
        self.state = backend.new_state(max_seq_len + self.tree_width * tree_nodes)
        self.cached: list[int] = []  # tokens whose keys/values are in the draft cache
        self.context_len = 0
        self.model_forwards = 0  # draft forwards this request (each reads the draft's weights once)

    @property
    def weight_bytes(self) -> int:
        return self.backend.weight_bytes

    @property
    def step_seconds(self) -> float | None:
        """The draft model's measured single-token step, with the head it scores: the curve measured
        for its reduced vocabulary where ``vocab_limit`` cuts the head (``--quantize auto`` timed it),
        else its whole vocabulary's (an upper bound; the controller's running average corrects it).
        The whole-vocabulary figure put the 0.5B int4-all step at 14.7 ms where the 32768-id head runs
        in ~10, and γ=auto then judged drafting not worth the draft's prompt pass on HumanEval, where
        γ=3 ran 1.14–1.43× plain (Zen 4 EPYC). On a fresh machine ``--quantize auto`` has timed only
        the reduced-vocabulary curve; it is read even then (it once was not: the first request on a
        new Xeon did not draft at all, 0.99× plain)."""
        curve = step_costs.draft_curve(self.backend.config, self.backend.mode, self.vocab_limit) or self.backend.step_seconds
        if curve is None:
            return None
        return Curve(self.backend.mode, rescaled(curve, self.backend.step_ratios)).cost(1)

    def catch_up_seconds(self, context_len: int) -> float:
        """The prompt pass over what the draft cache lacks (at most its context window), from the
        draft's measured curve (beyond its largest size: its last slope)."""
        pending = context_len - self.offset - self.state.seq_len
        if self.context_window:
            pending = min(pending, self.context_window)
        measured = planning_curve(self._runner(pending))
        if not measured or len(measured) < 2:
            return 0.0
        return Curve("draft", dict(measured)).cost(pending) if pending > 1 else 0.0

    def start(self, prompt_ids: list[int]) -> None:
        self.penalties = Penalties.build(self.params, prompt_ids, self.backend.config.vocab_size, self.stop_ids, strict=False)
        self.state.truncate(0)
        self.cached = []
        self.offset = 0
        self.model_forwards = 0

    def _sync(self, context_ids: list[int]) -> Generator[ModelCall, torch.Tensor, torch.Tensor]:
        """Feed committed tokens the draft cache lacks; return the logits after the last one."""
        if not self.cached and self.context_window and len(context_ids) > self.context_window:
            self.offset = len(context_ids) - self.context_window  # first round of a long prompt
        context_ids = context_ids[self.offset :]
        common = self.state.seq_len
        if self.cached[:common] != context_ids[:common]:  # defensive: never expected after accepted()
            common = 0
            while common < len(self.cached) and common < len(context_ids) and self.cached[common] == context_ids[common]:
                common += 1
            self.state.truncate(common)
            self.cached = self.cached[:common]
        # the first pass over a prompt starts from earlier prompts' blocks where the draft keeps them;
        # it runs where a cold pass of that length would (the prompt backend), so cached and computed
        # rows are the same bits and a request drafts the same tokens either way
        prefix_cache = self.backend.prefix_cache
        runner = self._runner(len(context_ids) - common)
        first_prompt_pass = prefix_cache is not None and not self.cached and runner is self.backend.prompt_backend
        if first_prompt_pass:
            common = prefix_cache.restore(self.state, context_ids)
            self.cached = context_ids[:common]
        pending = context_ids[common:]
        if not pending:  # the context is entirely cached: re-score the last token
            self.state.truncate(common - 1)
            self.cached.pop()
            pending = context_ids[-1:]
            runner = self._runner(1)
        logits = yield from self._forward(pending, runner)
        self.cached.extend(pending)
        if first_prompt_pass:
            prefix_cache.store(self.state, context_ids)
        return logits

    def _runner(self, pending: int) -> Backend:
        """A prompt pass (at least PROMPT_PASS_ROWS tokens to catch up on) runs on the draft's prompt
        backend, the rest on its own: decided by the request's history alone, never by its batch."""
        return self.backend.prompt_backend if pending >= PROMPT_PASS_ROWS else self.backend

    def _forward(self, tokens: list[int], backend: Backend | None = None) -> Generator[ModelCall, torch.Tensor, torch.Tensor]:
        self.model_forwards += 1
        return (yield from next_token_steps(backend or self.backend, self.state, tokens, self.vocab_limit,
                                            self.params.is_greedy))

    def propose(self, context_ids: list[int], k: int) -> Draft:
        return run_now(self.propose_steps(context_ids, k))

    def propose_steps(self, context_ids: list[int], k: int) -> Generator[ModelCall, torch.Tensor, Draft]:
        room = self.max_seq_len - len(context_ids)
        k = max(0, min(k, room))
        logits = yield from self._sync(context_ids)
        self.context_len = len(context_ids) - self.offset  # positions in the draft cache
        if self.tree_nodes:
            return (yield from self._propose_tree(logits, k, penalty_shape(self.penalties, context_ids)))

        def step(token: int) -> Generator[ModelCall, torch.Tensor, torch.Tensor]:
            self.cached.append(token)
            return (yield from self._forward([token]))

        return (yield from draft_steps(logits, step, k, self.params, self.generator, self.confidence_threshold,
                                       self.take_over, self.constraint, shape=penalty_shape(self.penalties, context_ids),
                                       position=len(context_ids)))

    def _propose_tree(self, logits: torch.Tensor, depth: int,
                      shape: Callable[[torch.Tensor, list[int]], torch.Tensor] | None) -> Generator[ModelCall, torch.Tensor, Draft]:
        """A token tree up to ``depth`` deep (:func:`grow_tree`), one draft forward of
        ``tree_width`` rows per level, each node attending to the context and its own ancestors in
        the draft cache's tree region; with penalties (``shape``) each node's row is ranked after
        its own path, as the target's row for it will be (:meth:`Penalties.apply_tree`)."""
        self.tree_base = self.state.seq_len
        self.tree_slots, region = {}, []

        def forward(expand: list[int], tokens: list[int], parents: list[int]) -> Generator[ModelCall, torch.Tensor, list[torch.Tensor] | None]:
            if self.state.seq_len + len(expand) > self.state.max_seq_len:
                return None
            for node in expand:
                self.tree_slots[node] = len(region)
                region.append(-1 if parents[node] < 0 else self.tree_slots[parents[node]])
            self.model_forwards += 1
            rows = yield ModelCall(self.backend, self.state, [tokens[n] for n in expand], vocab_limit=self.vocab_limit,
                                   tree=TreeLayout(self.tree_base, list(region)), role="draft")
            if shape is None:
                return [self._ranking_probs(row) for row in rows]
            return [self._ranking_probs(shape(row, [tokens[i] for i in path_to(parents, node)])) for node, row in zip(expand, rows)]

        first = logits if shape is None else shape(logits, [])
        draft = yield from grow_tree(self._ranking_probs(first), depth, self.tree_width, forward)
        self.tree_tokens = draft.tokens
        return draft

    def _ranking_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return ranking_probs(logits, self.params)

    def accepted_path(self, path: list[int], next_token: int) -> None:
        """Keep the accepted path's forwarded nodes in the draft cache (moved down after the
        context: ``KVCache.keep``); the rest of the path and ``next_token`` are fed next round."""
        if not self.tree_nodes:
            super().accepted_path(path, next_token)
            return
        forwarded = [node for node in path if node in self.tree_slots]  # a prefix of the path
        self.state.keep([self.tree_slots[node] for node in forwarded], self.tree_base)
        self.cached = self.cached[: self.tree_base] + [self.tree_tokens[node] for node in forwarded]
        self.tree_slots = {}

    def accepted(self, num_accepted: int, next_token: int) -> None:
        # keep the context and the accepted part of the proposal; next_token is fed next round
        keep = min(self.context_len + num_accepted, len(self.cached))
        self.state.truncate(keep)
        del self.cached[keep:]

    def finish(self) -> None:
        self.cached = []
        self.offset = 0
        self.state.truncate(0)


def make_draft_model_drafter(res: DrafterResources) -> DraftModelDrafter:
    if res.draft_backend is None:
        raise SpecdecError(f"method {res.spec.method!r} needs a draft model (--draft-model NAME_OR_PATH; the library: draft=)")
    spec = res.spec
    threshold = spec.draft_confidence_threshold if spec.adaptive else 0.0
    tree_nodes = model_tree_nodes_for(res)
    return DraftModelDrafter(res.draft_backend, res.params, res.generator, res.max_seq_len, threshold,
                             spec.draft_vocab_size or None, spec.draft_context_window, res.constraint, tree_nodes, res.stop_ids)


DRAFT_MODEL_OPTIONS = ("num_speculative_tokens", "draft_model", "draft_confidence_threshold", "draft_vocab_size",
                       "draft_context_window", "spec_tree")
#: the ``draft_model`` method's MethodInfo is drafters/draft_suffix.py's: with a predicted output the
#: draft model is assisted by the prediction's table, as draft_suffix is by the suffix tables
METHODS: tuple[MethodInfo, ...] = ()
