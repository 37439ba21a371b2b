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

from typing import Callable

import torch

from specdec.backends.base import Backend
from specdec.drafters.base import Draft, Drafter, DrafterResources, MethodInfo
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, logits_to_probs, sample_from_probs
from specdec.structured import GrammarConstraint


def draft_autoregressively(
    logits: torch.Tensor,
    step: Callable[[int], torch.Tensor],
    k: int,
    params: SamplingParams,
    generator: torch.Generator,
    confidence_threshold: float = 0.0,
    take_over: Callable[[list[int], int], list[int]] | None = None,
    constraint: GrammarConstraint | None = None,
) -> Draft:
    """Up to ``k`` tokens, one model step each: ``logits`` follow the context, ``step(token)`` feeds a
    drafted token and returns the next logits. Shared by every drafter that runs a model.

    Greedy drafts the argmax (q = None: a point mass, what greedy verification compares against);
    sampling draws from q = logits_to_probs(logits, params) — the same transform the target gets —
    and returns q for rejection sampling. ``confidence_threshold`` ends the round early once the
    draft's top probability falls below it (0 = never): that token is still proposed — its draft
    step is already paid, and one more verified token costs far less than a draft step — but no
    further step is drafted on it. ``take_over(drafted, room)``, asked before each further step,
    may return tokens that end the draft instead (a suffix table that is sure of the continuation:
    no step is paid for them); under sampling their q rows are point masses. ``constraint``
    (structured output) masks each step's logits with the grammar's mask after the tokens drafted
    so far — the mask the target's row gets — so q is the constrained draft distribution; drafting
    stops where the grammar allows nothing the draft can score.
    """
    tokens: list[int] = []
    probs: list[torch.Tensor] = []
    for i in range(k):
        if constraint is not None:
            masked = constraint.mask_logits(logits, tokens)
            if masked is None:
                break
            logits = masked
        if params.is_greedy:
            token = int(torch.argmax(logits))
            top_prob = float(torch.softmax(logits, -1).max()) if confidence_threshold else 1.0
            q = None
        else:
            q = logits_to_probs(logits, params)
            token = sample_from_probs(q, generator)
            top_prob = float(q.max())
        tokens.append(token)
        if q is not None:
            probs.append(q)
        if top_prob < confidence_threshold or i + 1 == k:
            break  # the draft is unsure: verifying now is cheaper than drafting on
        taken = take_over(tokens, k - len(tokens)) if take_over is not None else []
        if taken:
            tokens.extend(taken)
            if probs:  # sampling: point-mass q rows for the taken tokens
                probs.extend(point_mass(taken_token, logits.shape[-1], logits.device) for taken_token in taken)
            break
        logits = step(token)
    return Draft(tokens=tokens, probs=torch.stack(probs) if probs else None)


def point_mass(token: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """q for a deterministic proposal: the verifier's min(1, p/q) and max(p − q, 0) then reduce to
    the point-mass rule (accept with p(token); on rejection resample from p without it)."""
    q = torch.zeros(vocab_size, device=device)
    q[token] = 1.0
    return q


def next_token_logits(backend, state, tokens: list[int], vocab_limit: int | None, greedy: bool) -> torch.Tensor:  # noqa: ANN001
    """Logits after the last of ``tokens``. With a reduced draft vocabulary only ids < vocab_limit
    are scored; for sampling the rest get -inf, so q is exactly 0 there — a valid proposal
    distribution, which rejection sampling corrects like any other. Greedy needs no padding: the
    argmax over a prefix of ids is already a token id."""
    if vocab_limit is None:
        return backend.forward(state, tokens, num_logits=1)[-1]
    logits = backend.forward(state, tokens, num_logits=1, vocab_limit=vocab_limit)[-1]
    if greedy:
        return logits
    full = logits.new_full((backend.config.vocab_size,), float("-inf"))
    full[:vocab_limit] = logits
    return full


def usable_vocab_limit(vocab_limit: int | None, vocab_size: int) -> int | None:
    return vocab_limit if vocab_limit and vocab_limit < vocab_size else None


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
    ) -> None:
        self.backend = backend
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
        #: optional ``(drafted, room) -> tokens`` asked before each draft step (see draft_autoregressively)
        self.take_over: Callable[[list[int], int], list[int]] | None = None
        self.constraint = constraint  # structured output: the request's grammar (masks q like p)
        self.state = backend.new_state(max_seq_len)
        self.cached: list[int] = []  # tokens whose keys/values are in the draft cache
        self.context_len = 0
        self.model_forwards = 0  # draft forwards this request (each reads the draft's weights once)

    @property
    def weight_bytes(self) -> int:
        return self.backend.weight_bytes

    @property
    def step_seconds(self) -> float | None:
        """The draft model's measured single-token step (with its whole vocabulary: an upper bound
        when ``vocab_limit`` cuts the head; the controller's running average corrects it)."""
        measured = self.backend.step_seconds
        return None if measured is None else measured.get(1)

    def start(self, prompt_ids: list[int]) -> None:
        self.state.truncate(0)
        self.cached = []
        self.offset = 0
        self.model_forwards = 0

    def _sync(self, context_ids: list[int]) -> torch.Tensor:
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
        pending = context_ids[common:]
        if not pending:  # the context is entirely cached: re-score the last token
            self.state.truncate(common - 1)
            self.cached.pop()
            pending = context_ids[-1:]
        logits = self._forward(pending)
        self.cached.extend(pending)
        return logits

    def _forward(self, tokens: list[int]) -> torch.Tensor:
        self.model_forwards += 1
        return next_token_logits(self.backend, self.state, tokens, self.vocab_limit, self.params.is_greedy)

    def propose(self, context_ids: list[int], k: int) -> Draft:
        room = self.max_seq_len - len(context_ids)
        k = max(0, min(k, room))
        logits = self._sync(context_ids)
        self.context_len = len(context_ids) - self.offset  # positions in the draft cache

        def step(token: int) -> torch.Tensor:
            self.cached.append(token)
            return self._forward([token])

        return draft_autoregressively(logits, step, k, self.params, self.generator, self.confidence_threshold,
                                      self.take_over, self.constraint)

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
        raise SpecdecError(f"method {res.spec.method!r} needs a draft model (--draft-model NAME_OR_PATH)")
    spec = res.spec
    threshold = spec.draft_confidence_threshold if spec.adaptive else 0.0
    return DraftModelDrafter(res.draft_backend, res.params, res.generator, res.max_seq_len, threshold,
                             spec.draft_vocab_size or None, spec.draft_context_window, res.constraint)


DRAFT_MODEL_OPTIONS = ("num_speculative_tokens", "draft_model", "draft_confidence_threshold", "draft_vocab_size",
                       "draft_context_window")
METHODS = (MethodInfo("draft_model", make_draft_model_drafter, "a small model of the same tokenizer drafts autoregressively",
                      aliases=("draft",), needs_draft_model=True, options=DRAFT_MODEL_OPTIONS),)
