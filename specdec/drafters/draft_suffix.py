"""A draft model that is not run where the text repeats itself: suffix-assisted draft-model drafting.

Each round the suffix drafter (:mod:`specdec.drafters.suffix`) looks first. When its estimate that
its first token is accepted reaches ``suffix_trust`` — a long match: code re-using the prompt's
names and signatures, a summary quoting its document — its proposal is used as it is and the draft
model does not run; it catches up on the committed tokens in one chunk at the start of its next
round. A less sure proposal is used too where it promises more committed tokens per second than the
draft model's k tokens at the draft model's α in this request (``_copy_pays``: the target's verify
curve, the draft's step; on summaries the draft model's α is ~0.55), and wherever γ=auto gives the
draft model k = 0. Otherwise the draft model drafts — and if its tokens lead into a trusted match
mid-round, the table finishes the round instead of further draft steps. On HumanEval about 30 % of the target's
tokens follow a six-token match that is right ~95 % of the time; each one costs the draft model a
full step (~0.2–0.35 of an int8 target step here), and the suffix table nothing.

Exactness is untouched: every drafted token carries the distribution it was drawn from — the draft
model's q, or a point mass for a table token — and the shared verifier accepts either exactly.

A suffix round carries ``prefix_accept``, so its length is chosen by the engine's cost model and may
exceed the draft model's γ of the round (up to the request's maximum): a copy is worth verifying
as far as it is likely right, however many draft-model tokens would pay.
"""

from __future__ import annotations

from typing import Generator

import torch

from specdec.adaptive import OPTIMISTIC_ALPHA, TRIALS_TO_JUDGE, VerifyCosts, expected_tokens
from specdec.calls import ModelCall, run_now
from specdec.drafters.base import Draft, Drafter, DrafterResources, MethodInfo, tree_nodes_for
from specdec.drafters.draft_model import DRAFT_MODEL_OPTIONS, DraftModelDrafter, make_draft_model_drafter
from specdec.drafters.suffix import GlobalSuffixCache, SuffixDrafter, make_suffix_drafter
from specdec.stats import acceptance_trials
from specdec.step_calibration import planning_curve

#: Suffix proposals whose first token is estimated at least this likely are used without the draft
#: model (with MATCH_PRIOR: matches of two tokens or more). Lower than the draft model's own α
#: (0.7-0.8 on HumanEval) on purpose: a draft-model token costs a fifth to a third of a target step
#: and a suffix token nothing, so a less likely free token still pays. In-process A/B, 5 HumanEval
#: prompts, int8 target, γ=auto: 0.5 → 1.76× plain, 0.75 → 1.69×, draft model alone 1.60×.
DEFAULT_SUFFIX_TRUST = 0.5


class SuffixAssistedDrafter(Drafter):
    name = "draft_suffix"
    #: the engine asks even when the γ controller gives the draft model k = 0 (it does not pay):
    #: a trusted suffix proposal still does, and the draft model is not run for k = 0
    has_free_tokens = True

    def __init__(self, draft: DraftModelDrafter, suffix: SuffixDrafter, suffix_trust: float = DEFAULT_SUFFIX_TRUST,
                 verify_costs: VerifyCosts | None = None) -> None:
        self.draft = draft
        self.suffix = suffix
        self.suffix_trust = suffix_trust
        #: the target's measured verification seconds per drafted length (None: not measured — then only a
        #: trusted suffix proposal replaces the draft model, as before)
        self.verify_costs = verify_costs
        #: the draft model's acceptance in this request: (accepted, trials) over its rounds, from the prior
        self._model_accepted, self._model_trials = 0.0, 0.0
        self._model_proposed = 0  # tokens the draft model proposed this round (its trials when judged)
        self._last: SuffixDrafter | DraftModelDrafter | None = None  # who proposed this round
        self.suffix_rounds = 0
        self.draft_rounds = 0
        self.taken_over = 0  # draft-model rounds the suffix table finished
        self._context: list[int] = []
        #: this round's take-over, when the table finished a draft-model round: (its offset in the
        #: draft, its tokens, which came from the request's prediction) — to count the prediction's use
        self._taken: tuple[int, list[int], list[bool]] | None = None
        draft.take_over = self._take_over

    @property
    def weight_bytes(self) -> int:
        return self.draft.weight_bytes

    @property
    def step_seconds(self) -> float | None:
        return self.draft.step_seconds

    @property
    def model_forwards(self) -> int:  # type: ignore[override] - the draft model's count
        return self.draft.model_forwards

    def catch_up_seconds(self, context_len: int) -> float:
        return self.draft.catch_up_seconds(context_len)

    @property
    def prediction_counts(self) -> tuple[int, int] | None:
        return self.suffix.prediction_counts

    def start(self, prompt_ids: list[int]) -> None:
        self.suffix.start(prompt_ids)
        self.draft.start(prompt_ids)
        self.suffix_rounds = self.draft_rounds = self.taken_over = 0
        self._model_accepted, self._model_trials, self._model_proposed = 0.0, 0.0, 0

    def propose(self, context_ids: list[int], k: int) -> Draft:
        return run_now(self.propose_steps(context_ids, k))

    def propose_steps(self, context_ids: list[int], k: int) -> Generator[ModelCall, torch.Tensor, Draft]:
        copied = self.suffix.propose(context_ids, k)  # as long as it is sure of, up to its max_tokens
        if copied.prefix_accept and (copied.prefix_accept[0] >= self.suffix_trust or self._copy_pays(copied, k)):
            self._last = self.suffix
            self.suffix_rounds += 1
            return copied
        if k == 0:
            self._last = None
            return Draft(tokens=[])
        self._last = self.draft
        self.draft_rounds += 1
        self._context = context_ids
        self._taken = None
        drafted = yield from self.draft.propose_steps(context_ids, k)
        self._model_proposed = len(drafted.tokens)
        return drafted

    def _copy_pays(self, copied: Draft, k: int) -> bool:
        """Does the table's less sure proposal promise more committed tokens per second than the draft model's
        k tokens? Its tokens cost no draft step (the draft model catches up on what it commits later: one
        draft step is charged for that); the draft model's cost k steps and are accepted at its measured α
        in this request (planned optimistically until judged, as γ=auto plans). Where the draft model is
        not worth running (k = 0) the proposal is verified as far as it is worth its cost, as ``suffix``
        does. On summaries and RAG answers the draft model's α is ~0.55 and the table's copies win: there
        ``suffix`` alone ran 1.62x plain where draft_suffix ran 1.32x (Zen 5, before this choice)."""
        if k == 0:  # (a copy the engine would cut to nothing is not a suffix round)
            return self.verify_costs is None or self.verify_costs.best_length(copied.prefix_accept) > 0
        draft_step = self.draft.step_seconds
        if self.verify_costs is None or draft_step is None or copied.parents is not None:
            return False
        costs = self.verify_costs
        length = costs.best_length(copied.prefix_accept)
        if length == 0:
            return False
        copy_rate = (1.0 + sum(copied.prefix_accept[:length])) / (costs.cost(length) + draft_step)
        alpha = (self._model_accepted / self._model_trials if self._model_trials >= TRIALS_TO_JUDGE
                 else OPTIMISTIC_ALPHA)
        model_rate = expected_tokens(alpha, k) / (costs.cost(k) + k * draft_step)
        return copy_rate > model_rate

    def _take_over(self, drafted: list[int], room: int) -> list[int]:
        """Mid-round: once the draft model's tokens lead into a trusted match, the table finishes
        the round (its tokens cost no draft step)."""
        copied, _, predicted = self.suffix.continuation(self._context[-self.suffix.local.max_depth :] + drafted, room)
        if copied.prefix_accept and copied.prefix_accept[0] >= self.suffix_trust:
            self.taken_over += 1
            self._taken = (len(drafted), copied.tokens, predicted)
            return copied.tokens
        return []

    def accepted(self, num_accepted: int, next_token: int) -> None:
        # only the drafter that proposed has state to roll; the other sees the committed tokens in
        # its next propose() (the draft model feeds them as one chunk, the suffix table counts them)
        if self._last is not None:
            self._last.accepted(num_accepted, next_token)
        if self._last is self.draft and self._model_proposed:  # the draft model's own α (a take-over's tokens too)
            self._model_accepted += min(num_accepted, self._model_proposed)
            self._model_trials += acceptance_trials(self._model_proposed, min(num_accepted, self._model_proposed))
            self._model_proposed = 0
        if self._last is self.draft and self._taken is not None and num_accepted >= self._taken[0]:
            offset, tokens, predicted = self._taken
            self.suffix.count_prediction(tokens, predicted, num_accepted - offset, next_token)
        self._last, self._taken = None, None

    def accepted_path(self, path: list[int], next_token: int) -> None:
        """After a tree (``spec_tree``: both parts grow trees; whichever proposed rolls its state)."""
        if self._last is not None:
            self._last.accepted_path(path, next_token)
        self._last = None

    def finish(self) -> None:
        self.suffix.finish()
        self.draft.finish()


def make_suffix_assisted_drafter(res: DrafterResources) -> SuffixAssistedDrafter:
    """Needs a draft model (``--draft-model``) like ``draft_model``; the suffix table is the shared one."""
    draft = make_draft_model_drafter(res)
    suffix = make_suffix_drafter(res)
    measured = planning_curve(res.target_backend)
    return SuffixAssistedDrafter(draft, suffix, DEFAULT_SUFFIX_TRUST, VerifyCosts.from_measured(measured) if measured else None)


def make_draft_model_method_drafter(res: DrafterResources) -> Drafter:
    """``draft_model``: the draft model alone — or, for a request with a predicted output, the draft model
    except where the prediction is sure of the continuation (or has one, where γ=auto gives the draft model
    nothing to draft): this class over a table of the prediction
    only (neither the request's own text nor other requests', which are draft_suffix's), so a user who
    chose the draft model still gets OpenAI's predicted outputs."""
    draft = make_draft_model_drafter(res)
    if not res.prediction_ids:
        return draft
    table = SuffixDrafter(cache=GlobalSuffixCache(), tree_nodes=tree_nodes_for(res, reads_prediction=True),
                          prediction=res.prediction_ids, max_tokens=res.spec.max_draft_tokens(True), only_prediction=True)
    drafter = SuffixAssistedDrafter(draft, table, DEFAULT_SUFFIX_TRUST)
    drafter.name = "draft_model"
    return drafter


METHODS = (MethodInfo("draft_model", make_draft_model_method_drafter, "a small model of the same tokenizer drafts autoregressively",
                      aliases=("draft",), needs_draft_model=True, options=DRAFT_MODEL_OPTIONS, reads_prediction=True),
           MethodInfo("draft_suffix", make_suffix_assisted_drafter,
                      "the draft model, except where the suffix table is sure of the continuation",
                      needs_draft_model=True, options=DRAFT_MODEL_OPTIONS, reads_prediction=True),)
