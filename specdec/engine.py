"""The generation loop: plain autoregressive decoding, or draft → verify → commit.

Plain decoding is the same loop with zero drafted tokens, so both paths share the prefill, the
sampling transform, the stop logic and the cache bookkeeping — the only difference speculation makes
is how many tokens one target forward commits. One speculative step (ARCHITECTURE.md):

1. committed tokens ``x[0..n)``; the target cache holds ``n-1`` positions (``x[n-1]`` is the next input);
2. ``draft = drafter.propose(x, k)`` (as steps: its model's forwards are yielded too, ``specdec.calls``);
3. target forward on ``[x[n-1], d_1..d_k]`` → ``k+1`` logits;
4. ``n_acc, nxt = verify(draft, logits)``;
5. commit ``d_1..d_{n_acc}, nxt``; truncate the target cache to ``n + n_acc``; tell the drafter.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterable, Iterator

import torch

from specdec.adaptive import GammaController, VerifyCosts
from specdec.alternatives import alternative_scale, running_alpha, with_alternatives
from specdec.backends.base import Backend, SequenceState
from specdec.calls import ModelCall
from specdec.config import SpecConfig
from specdec.drafters.base import Draft, Drafter
from specdec.errors import ContextLengthError, SpecdecError, WeightsError
from specdec.output import OutputTracker, request_stop_ids
from specdec.penalties import Penalties
from specdec.prefix_cache import PrefixCache
from specdec.rounds import check_proposal, fit_draft, learn, proposal, proposed_for_alpha, tell_drafter, verify_round
from specdec.sampling import SamplingParams, TokenLogprob, make_generator, token_logprobs
from specdec.seeded import chain_clocks
from specdec.step_calibration import planning_curve
from specdec.stats import Round, Stats
from specdec.structured import GrammarConstraint
from specdec.threads import adapt_threads
from specdec.verify import verify


@dataclass
class StreamChunk:
    """Tokens committed by one step (after stop handling) and the text that became final."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None  # "stop" | "length" on the last chunk
    stats: Stats | None = None  # on the last chunk
    #: one per token of ``token_ids`` when ``params.logprobs`` is set (the target's log-probabilities)
    logprobs: list[TokenLogprob] | None = None
    #: the decode rounds completed since the previous chunk (a server learns its traffic's α as they run)
    rounds: list[Round] = field(default_factory=list)
    #: on the first chunk when ``params.prompt_logprobs`` is set: one per prompt token (None for the first)
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def to_dict(self) -> dict:
        """JSON-ready: the stats as :meth:`Stats.to_dict` gives them, log-probabilities as dicts, the rounds counted."""
        return {"token_ids": list(self.token_ids), "text": self.text, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict() if self.stats is not None else None, "logprobs": logprob_dicts(self.logprobs),
                "rounds": len(self.rounds), "prompt_logprobs": logprob_dicts(self.prompt_logprobs)}


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    finish_reason: str
    stats: Stats
    prompt_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # one per token when params.logprobs was set
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token when params.prompt_logprobs was set

    def to_dict(self) -> dict:
        """JSON-ready (``json.dumps(result.to_dict())``): dataclasses.asdict kept Stats' rounds and no JSON encoder
        took the result itself."""
        return {"token_ids": list(self.token_ids), "text": self.text, "finish_reason": self.finish_reason,
                "prompt_ids": list(self.prompt_ids), "stats": self.stats.to_dict(), "logprobs": logprob_dicts(self.logprobs),
                "prompt_logprobs": logprob_dicts(self.prompt_logprobs)}


def logprob_dicts(entries: list[TokenLogprob | None] | None) -> list[dict | None] | None:
    """Log-probability entries as plain dicts (None stays None: the first prompt token has none)."""
    return None if entries is None else [None if entry is None else dataclasses.asdict(entry) for entry in entries]


#: prompt rows scored per prefill call when a request asks for prompt_logprobs
PROMPT_LOGPROBS_CHUNK = 128


def check_context(prompt_len: int, max_tokens: int, context_len: int) -> None:
    if prompt_len == 0:
        raise SpecdecError("the prompt is empty: give at least one token")
    if prompt_len + max_tokens > context_len:
        raise ContextLengthError(
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceed the model's context window "
            f"of {context_len} tokens; shorten the prompt or lower max_tokens"
        )


def generate_stream(
    target: Backend,
    prompt_ids: list[int],
    params: SamplingParams,
    drafter: Drafter | None = None,
    spec: SpecConfig | None = None,
    tokenizer=None,  # noqa: ANN001 - specdec.tokenizer.Tokenizer; needed for text and stop strings
    generator: torch.Generator | None = None,
    speculate: Callable[[], int | None] | None = None,
    constraint: GrammarConstraint | None = None,
    saving_under_load: Callable[[], float | None] | None = None,
) -> Iterator[StreamChunk]:
    """Generate from ``prompt_ids``; yields one :class:`StreamChunk` per target forward (the
    arguments are :func:`generate_steps`'s, which this drives, running each forward at once)."""
    steps = generate_steps(target, prompt_ids, params, drafter, spec, tokenizer, generator, speculate, constraint,
                           saving_under_load=saving_under_load)
    try:
        logits = None
        while True:
            try:
                item = steps.send(logits)
            except StopIteration:
                return
            if isinstance(item, ModelCall):
                logits = item.run()
            else:
                logits = None
                yield item
    finally:
        steps.close()  # the drafter's cleanup runs even when the consumer stops early


def generate_steps(
    target: Backend,
    prompt_ids: list[int],
    params: SamplingParams,
    drafter: Drafter | None = None,
    spec: SpecConfig | None = None,
    tokenizer=None,  # noqa: ANN001 - specdec.tokenizer.Tokenizer; needed for text and stop strings
    generator: torch.Generator | None = None,
    speculate: Callable[[], int | None] | None = None,
    constraint: GrammarConstraint | None = None,
    prefill_chunk: int | Callable[[int, int], int] = 0,
    alpha_prior: float | None = None,
    saving_under_load: Callable[[], float | None] | None = None,
) -> Generator[StreamChunk | ModelCall, torch.Tensor | None, None]:
    """Generate from ``prompt_ids``: yields a :class:`~specdec.calls.ModelCall` whenever it needs
    the target or the drafter's model (and must be sent the logits back: one call at a time,
    :func:`generate_stream`, or many requests' calls in one batched forward, the server's
    scheduler), and one :class:`StreamChunk` per target forward.

    ``speculate`` is asked before every step: the most tokens the step may draft (0: none, None: no
    cap) — a server drafts less or nothing under load, where verification rows cost throughput; a
    token tree then verifies at most that many nodes too (its rows cost what a chain's do).
    ``saving_under_load`` is asked once, before a draft model's first pass over the prompt: the
    seconds of forward time per committed token speculation saves at the server's current load
    (None: the request is alone, and its own γ controller's estimate decides) — the prompt pass must
    be paid back from that, and sharing forwards with other requests saves less than drafting alone.
    ``constraint``: this request's grammar state when ``params.structured`` is set — the one the
    drafter masks its own distribution with (:func:`specdec.api.prepare` builds both); built here
    when not given, and then only the target's rows are masked (still exact, see
    :mod:`specdec.structured`). ``prefill_chunk`` > 0 feeds a longer prompt in calls of that many
    tokens (chunked prefill: under continuous batching a long prompt then shares forwards with
    other requests' decode steps instead of stalling them; bit-identical where the target's layers
    are row by row, :func:`specdec.chunking.default_prefill_chunk`); a callable is asked before each call with the
    prompt tokens still to feed and the prompt pass's total (a server shrinks a long prompt's chunks while other
    requests decode: :func:`specdec.chunking.shared_prefill_chunk`). ``alpha_prior``: the acceptance rate
    γ=auto starts from (a server's measured on its traffic; None: the controller's 0.7)."""
    spec = spec or SpecConfig()
    context_len = target.config.max_position_embeddings
    vocab_size = target.config.vocab_size  # drafted ids outside it are cut (Draft.clipped)
    check_context(len(prompt_ids), params.max_tokens, context_len)
    max_k = spec.max_speculative_tokens if drafter is not None else 0  # a model drafter's γ at most
    # the longest chain (or deepest tree) a round verifies: longer for a predicted output's table tokens
    predicted = drafter is not None and drafter.prediction_counts is not None
    max_room = spec.max_draft_tokens(predicted) if drafter is not None else 0
    max_nodes = spec.tree_nodes(params.is_greedy, target.step_seconds, predicted) if drafter is not None else 0  # 0: chains
    alternatives = max_nodes > 0 and not params.is_greedy  # sampled chains become trees (specdec.alternatives)
    cache_len = min(len(prompt_ids) + params.max_tokens + max(max_room, max_nodes) + 1, context_len)
    generator = generator or make_generator(params.seed, target.device)

    stop_ids = request_stop_ids(params, tokenizer)
    if params.stop and tokenizer is None:
        raise SpecdecError("stop strings need a tokenizer")
    out = OutputTracker(params, stop_ids, tokenizer)
    if params.structured is not None and constraint is None:
        if tokenizer is None:
            raise SpecdecError("structured output needs a tokenizer")
        constraint = GrammarConstraint.build(params.structured, tokenizer, vocab_size)
    penalties = Penalties.build(params, prompt_ids, vocab_size, stop_ids)  # bias, penalties, min_tokens (or None)
    stats = Stats(
        method=drafter.name if drafter is not None else "ar",
        dtype=target.dtype_name,
        prompt_tokens=len(prompt_ids),
        weight_bytes=target.weight_bytes,
        draft_weight_bytes=drafter.weight_bytes if drafter is not None else 0,
        kv_bytes_per_token=target.kv_bytes_per_token,
    )
    target_seconds = planning_curve(target)
    gamma = None
    if spec.adaptive and drafter is not None:
        gamma = GammaController.from_measured(max_k, target_seconds, drafter.step_seconds, alpha_prior)
    # for drafts with prefix_accept and trees: what verifying k drafted tokens costs here
    verify_costs = gamma.verify if gamma is not None else VerifyCosts.from_measured(target_seconds)

    start = time.perf_counter()
    state = target.new_state(cache_len)
    if drafter is not None:  # before the prefill: a feature drafter (EAGLE) has the target keep its features
        drafter.bind_target_state(state)
    # prompt_logprobs: every prompt row is scored (so none comes from the prefix cache, which keeps no logits)
    prefix_cache = target.prefix_cache if params.prompt_logprobs is None else None  # earlier prompts' keys/values
    stats.note_threads(adapt_threads(target.device))
    logits, prompt_scores, stats.cached_prompt_tokens = yield from prompt_pass(target, state, prompt_ids, params,
                                                                               prefix_cache, prefill_chunk)
    if not bool(torch.isfinite(logits[-1]).all()):  # one row, once: corrupt weights answered empty text, exit 0
        raise WeightsError("the target computed NaN/inf logits for this prompt: its weights are corrupt or out of "
                           "range (pull or convert the model again)")
    scored = constraint.mask_rows(logits, 0) if constraint is not None else logits
    if penalties is not None:
        scored = penalties.apply(scored, [])
    _, first = verify([], None, scored, params, generator, position=len(prompt_ids))
    context = list(prompt_ids) + [first]
    committed = commit_tokens(out, constraint, [first])
    stats.prefill_time_s = stats.ttft_s = time.perf_counter() - start
    decode_start = time.perf_counter()
    drafting_pays = True
    if drafter is not None:
        drafter.start(list(prompt_ids))
        if gamma is not None:  # γ=auto: a draft model's prompt pass must be paid back by this request's tokens
            note = unpaid_prompt_pass(drafter, gamma, len(context), params.max_tokens, saving_under_load)
            drafting_pays = note is None
            stats.speculation_note = note or ""
    reported = 0  # rounds handed out in chunks so far
    try:
        if out.finish_reason is None:
            yield StreamChunk(committed, out.new_text(), logprobs=logprobs_of(logits, committed, params),
                              prompt_logprobs=prompt_scores)
            committed, prompt_scores = [], None
        while out.finish_reason is None:
            stats.note_threads(adapt_threads(target.device))  # on the cores other processes left (specdec/threads.py)
            remaining = params.max_tokens - len(out.token_ids)
            room = max(0, min(max_room, remaining - 1, context_len - len(context)))
            k = min(gamma.choose() if gamma is not None else max_k, room) if drafting_pays else 0
            cap = speculate() if speculate is not None else None
            nodes = max_nodes  # this round's tree budget
            if cap is not None:  # under load the cap bounds verification rows, a tree's as a chain's
                k, room, nodes = min(k, cap), min(room, cap), min(max_nodes, cap)

            t0 = time.perf_counter()
            # a drafter with free tokens (a suffix table) is asked even when γ is 0 for its model
            asked = drafter is not None and (k > 0 or (room > 0 and drafter.has_free_tokens))
            # time spent suspended while other requests' forwards ran is not this round's cost
            draft, idle = (yield from proposal(drafter, context, k)) if asked else (Draft(tokens=[]), 0.0)
            if asked:
                check_proposal(drafter, draft, vocab_size)
            fitted = fit_draft(draft, k, room, nodes, state.max_seq_len - len(context), verify_costs, vocab_size, constraint)
            if alternatives and constraint is None and fitted.draft.probs is not None and fitted.drafted:
                fitted.draft = with_alternatives(  # trees under sampling (specdec.alternatives)
                    fitted.draft, min(nodes, state.max_seq_len - len(context) - 1),
                    gamma.planning_alpha if gamma is not None else running_alpha(stats.accepted_tokens, stats.proposed_tokens),
                    verify_costs, alternative_scale(stats.alternative_wins, stats.alternative_promised),
                    chain_clocks(params, len(context), fitted.draft.probs))
            t1 = time.perf_counter()
            verified = yield from verify_round(target, state, context, fitted, params, generator, constraint, penalties, stats)
            if drafter is not None:
                tell_drafter(drafter, fitted, verified)
            t2 = time.perf_counter()
            t1, t2 = t1 - idle, t2 - idle - verified.idle  # this round's own draft and verify times

            logits, new_tokens = verified.logits, verified.new_tokens
            context.extend(new_tokens)
            committed = commit_tokens(out, constraint, new_tokens)
            # the stats count this round's tokens up to the one that ended the request (a stop token
            # inside an accepted block: what follows it is neither output nor accepted, nor judged)
            stats.record_step(proposed_for_alpha(fitted.drafted, verified, out.consumed),
                              min(verified.drafter_accepted, out.consumed), t1 - t0, t2 - t1, out.consumed)
            stats.grammar_forced_tokens += verified.accepted - verified.drafter_accepted
            stats.rounds.append(Round(verified.verified_as, verified.drafter_accepted,
                                      verified.accepted - verified.drafter_accepted, new_tokens, verified.first_choices))
            learn(gamma, verify_costs, drafter, fitted, verified, t1 - t0, t2 - t1)
            stats.generated_tokens = len(out.token_ids)
            stats.decode_time_s = time.perf_counter() - decode_start
            if out.finish_reason is not None:
                break
            yield StreamChunk(committed, out.new_text(), logprobs=logprobs_of(logits, committed, params),
                              rounds=stats.rounds[reported:])
            committed, reported = [], len(stats.rounds)
        if prefix_cache is not None and target.prompt_backend is target:
            # every row came from the kernels a prompt pass runs: the answer is a reusable prefix too
            # (a chat client sends it back with its next message)
            prefix_cache.store(state, context[: state.seq_len])
        stats.generated_tokens = len(out.token_ids)
        stats.decode_time_s = time.perf_counter() - decode_start
        stats.total_time_s = time.perf_counter() - start
        stats.draft_forwards = drafter.model_forwards if drafter is not None else None
        stats.prediction_counts = drafter.prediction_counts if drafter is not None else None
        yield StreamChunk(committed, out.new_text(), finish_reason=out.finish_reason, stats=stats,
                          logprobs=logprobs_of(logits, committed, params), rounds=stats.rounds[reported:],
                          prompt_logprobs=prompt_scores)  # still unsent when the first token ended the request
    finally:
        if drafter is not None:
            drafter.finish()


def prompt_pass(target: Backend, state: SequenceState, prompt_ids: list[int], params: SamplingParams,
                prefix_cache: PrefixCache | None, prefill_chunk: int | Callable[[int, int], int],
                ) -> Generator[ModelCall, torch.Tensor, tuple[torch.Tensor, list[TokenLogprob | None] | None, int]]:
    """Feed the prompt to the target (its cheaper-for-prompts twin where it has one): the part the
    prefix cache does not hold, ``prefill_chunk`` tokens a call when > 0 (a callable: asked before each
    call with the tokens still to feed and this pass's total; any chunking gives the same logits where chunking is on at all). Returns the last row's
    logits ``[1, vocab]``, the prompt's logprobs when asked (every row scored, in calls of at most
    PROMPT_LOGPROBS_CHUNK rows: a row of logits is 0.6 MB at 152k ids) and the tokens restored from
    the prefix cache. The prompt's keys/values then go to the prefix cache."""
    scores: list[TokenLogprob | None] | None = None if params.prompt_logprobs is None else [None]
    rows = 1 if scores is None else None
    cached = fed = prefix_cache.restore(state, prompt_ids) if prefix_cache is not None else 0
    runner = target.prompt_backend  # the target itself, or its cheaper-for-prompts twin
    while True:
        chunk = prefill_chunk(len(prompt_ids) - fed, len(prompt_ids) - cached) if callable(prefill_chunk) else prefill_chunk
        if scores is not None:
            chunk = min(chunk or PROMPT_LOGPROBS_CHUNK, PROMPT_LOGPROBS_CHUNK)
        end = fed + chunk if 0 < chunk < len(prompt_ids) - fed else len(prompt_ids)
        logits = yield ModelCall(runner, state, list(prompt_ids[fed:end]), rows, prompt=True)
        if scores is not None:  # row r scored prompt token fed + r + 1
            scores += token_logprobs(logits, prompt_ids[fed + 1 : end + 1], params.prompt_logprobs)
        fed = end
        if fed == len(prompt_ids):
            break
    if prefix_cache is not None:
        prefix_cache.store(state, prompt_ids)
    return logits[-1:], scores, cached


#: how :func:`unpaid_prompt_pass` begins its note where a drafter still drafts without its model (bench's report reads it)
DRAFT_MODEL_SITS_OUT = "the draft model sits out (free drafts only)"


def unpaid_prompt_pass(drafter: Drafter, gamma: GammaController, context_len: int, max_tokens: int,
                       saving_under_load: Callable[[], float | None] | None) -> str | None:
    """Why this request should not draft (None: it should): a draft model's pass over the prompt
    costs ``catch_up`` seconds, paid back only if the request's remaining tokens save more than that
    — at the server's load when ``saving_under_load`` says (sharing forwards saves less than
    drafting alone), else by the γ controller's estimate (unmeasured: the first rounds measure it)."""
    catch_up = drafter.catch_up_seconds(context_len)
    if not catch_up:
        return None
    if max_tokens <= 1:  # the prompt pass's token is the whole answer
        return "not drafting: the request asks for one token, which the prompt pass gives"
    loaded = saving_under_load() if saving_under_load is not None else None
    saving = gamma.saving_per_token() if loaded is None else loaded
    if saving is None or (max_tokens - 1) * saving > catch_up:
        return None
    # a drafter with free tokens (draft_suffix's suffix table) still drafts: "not drafting" read as nothing drafted
    # beside a τ of 4.33 (a walkthrough)
    what = DRAFT_MODEL_SITS_OUT if drafter.has_free_tokens else "not drafting"
    return (f"{what}: the draft's pass over the prompt (~{catch_up * 1e3:.0f} ms measured cost) would not be "
            f"paid back by {max_tokens - 1} more token{'s' if max_tokens != 2 else ''}"
            + (" with the requests sharing its forwards" if loaded is not None else ""))


def commit_tokens(out: OutputTracker, constraint: GrammarConstraint | None, tokens: list[int]) -> list[int]:
    """Commit one step's tokens to the output (stop rules applied) and to the grammar, if any: nothing
    after the token that completes the grammar is output, and a completed grammar ends the request."""
    if constraint is None:
        return out.add(tokens)
    committed = out.add(tokens[: constraint.commit(tokens)])
    out.end_with_grammar(constraint.finished)
    return committed


def logprobs_of(logits: torch.Tensor, committed: list[int], params: SamplingParams) -> list[TokenLogprob] | None:
    """The target's log-probabilities of this step's committed tokens (``logits`` row i scored
    committed token i: the verification rows, or the prefill's last row), or None when the request
    did not ask for them. Called where a chunk is yielded: ``logits`` and ``committed`` are then
    always the same step's (a request finishes only in the step that committed its last tokens)."""
    if params.logprobs is None:
        return None
    return token_logprobs(logits, committed, params.logprobs) if committed else []


def generate_ids(
    target: Backend,
    prompt_ids: list[int],
    params: SamplingParams,
    drafter: Drafter | None = None,
    spec: SpecConfig | None = None,
    tokenizer=None,  # noqa: ANN001
    generator: torch.Generator | None = None,
    constraint: GrammarConstraint | None = None,
) -> GenerationResult:
    """Run :func:`generate_stream` to the end and collect the result."""
    chunks = generate_stream(target, prompt_ids, params, drafter, spec, tokenizer, generator, constraint=constraint)
    return collect(chunks, prompt_ids, params)


def collect(chunks: Iterable[StreamChunk], prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
    """One request's chunks, in order, as its :class:`GenerationResult`."""
    token_ids: list[int] = []
    text: list[str] = []
    logprobs: list[TokenLogprob] | None = None if params.logprobs is None else []
    prompt_logprobs = None
    last = None
    for chunk in chunks:
        prompt_logprobs = chunk.prompt_logprobs if chunk.prompt_logprobs is not None else prompt_logprobs
        token_ids.extend(chunk.token_ids)
        text.append(chunk.text)
        if logprobs is not None and chunk.logprobs is not None:
            logprobs.extend(chunk.logprobs)
        last = chunk
    assert last is not None and last.stats is not None and last.finish_reason is not None
    return GenerationResult(token_ids, "".join(text), last.finish_reason, last.stats, list(prompt_ids), logprobs,
                            prompt_logprobs)
