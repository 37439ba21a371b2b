"""Suffix decoding (SuffixDecoding, Oliaro et al. 2024; ArcticInference): draft from repeated
patterns in the current prompt + output and in a bounded global cache of earlier requests' outputs.

Both sources are variable-order frequency tables: for every context of up to ``max_depth`` tokens,
how often each next token followed it. To propose, the longest context matching the end of the
current sequence predicts the most frequent next token; the walk goes on (re-matching after each
drafted token) while the product of the tokens' acceptance estimates stays above ``min_confidence``
— so the speculation length follows the match, as in SuffixDecoding — and hands the products to
the engine (``Draft.prefix_accept``), which verifies only the length worth its measured verify
cost (all of it where verification is flat, as with int8 or on a GPU; the likely head with int4).
A token's estimate is count/total times how often matches of its length have been accepted (a
running per-request rate, see ``MATCH_PRIOR``): in a fresh prompt almost every context occurs once,
so count/total alone is 1 for a one-token match that is right a third of the time, and drafting on
it wastes verification work a CPU pays for per token. The global cache lives for the process
(shared across server requests on purpose), counts its entries, and evicts whole requests, least
recently used first, above ``max_cache_entries``.
"""

from __future__ import annotations

import heapq
import threading
from collections import Counter, OrderedDict

from specdec.config import DEFAULT_SUFFIX_CACHE_ENTRIES
from specdec.drafters.base import Draft, Drafter, DrafterResources, MethodInfo, tree_nodes_for
from specdec.prediction import count_prediction
from specdec.tree import children


class FrequencyTable:
    """context (tuple of ≤ max_depth tokens) → Counter of the next token."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.table: dict[tuple[int, ...], Counter] = {}
        self.entries = 0  # number of (context, next) counts stored, the memory measure

    def add(self, tokens: list[int], start: int = 0, sign: int = 1) -> None:
        """Count every (context → next token) pair whose next token is at index ≥ ``start``."""
        for position in range(max(start, 1), len(tokens)):
            nxt = tokens[position]
            for depth in range(1, min(self.max_depth, position) + 1):
                key = tuple(tokens[position - depth : position])
                counter = self.table.get(key)
                if sign > 0:
                    if counter is None:
                        counter = self.table[key] = Counter()
                    counter[nxt] += 1
                    self.entries += 1
                elif counter is not None:
                    counter[nxt] -= 1
                    self.entries -= 1
                    if counter[nxt] <= 0:
                        del counter[nxt]
                    if not counter:
                        del self.table[key]

    def predict(self, tokens: list[int], choices: int = 1) -> tuple[list[tuple[int, float]], int] | None:
        """The ``choices`` most frequent next tokens with their share of the count, from the longest
        matching context, and its length; None when no context matches."""
        for depth in range(min(self.max_depth, len(tokens)), 0, -1):
            counter = self.table.get(tuple(tokens[-depth:]))
            if counter:
                total = sum(counter.values())
                return [(token, count / total) for token, count in counter.most_common(choices)], depth
        return None


class GlobalSuffixCache:
    """Earlier requests' outputs, LRU-evicted by request above a cap on stored entries (0: none kept)."""

    def __init__(self, max_depth: int = 8, max_cache_entries: int = DEFAULT_SUFFIX_CACHE_ENTRIES) -> None:
        self.table = FrequencyTable(max_depth)
        self.max_cache_entries = max_cache_entries
        self.requests: OrderedDict[int, list[int]] = OrderedDict()
        self._next_id = 0
        self.lock = threading.Lock()

    def add_request(self, tokens: list[int]) -> None:
        with self.lock:
            if self.max_cache_entries <= 0:  # nothing is kept across requests
                return
            self.table.add(tokens)
            self.requests[self._next_id] = list(tokens)
            self._next_id += 1
            self._evict()

    def resize(self, max_cache_entries: int) -> None:
        """A new cap; the oldest requests leave until the table fits it."""
        with self.lock:
            self.max_cache_entries = max_cache_entries
            self._evict()

    def _evict(self) -> None:
        while self.table.entries > self.max_cache_entries and self.requests:
            _, old = self.requests.popitem(last=False)
            self.table.add(old, sign=-1)

    def predict(self, tokens: list[int], choices: int = 1) -> tuple[list[tuple[int, float]], int] | None:
        with self.lock:
            return self.table.predict(tokens, choices)


#: one per vocabulary per process: the server's requests share it on purpose; keying by vocabulary keeps
#: token ids learned under one tokenizer from being proposed to a model with another
GLOBAL_CACHES: dict[str, GlobalSuffixCache] = {}
_GLOBAL_CACHES_LOCK = threading.Lock()
_global_cache_entries = DEFAULT_SUFFIX_CACHE_ENTRIES


def global_cache_for(vocabulary_key: str) -> GlobalSuffixCache:
    with _GLOBAL_CACHES_LOCK:
        if vocabulary_key not in GLOBAL_CACHES:
            GLOBAL_CACHES[vocabulary_key] = GlobalSuffixCache(max_cache_entries=_global_cache_entries)
        return GLOBAL_CACHES[vocabulary_key]


def global_cache_entries() -> int:
    """The cap new and existing process-wide tables keep to (:func:`set_global_cache_entries`)."""
    return _global_cache_entries


def set_global_cache_entries(max_entries: int) -> None:
    """Cap every process-wide table, existing and future, at ``max_entries`` (0: nothing kept across requests)."""
    global _global_cache_entries
    with _GLOBAL_CACHES_LOCK:  # (no cache lock is held while taking this one: no deadlock)
        _global_cache_entries = max_entries
        for cache in GLOBAL_CACHES.values():
            cache.resize(max_entries)


#: P(drafted token accepted | the ones before it were), by the length of the context match that
#: predicted it (index = length - 1, the last entry for longer ones). Measured by replaying this
#: drafter against greedy outputs of qwen2.5-coder-1.5b on HumanEval and Spec-Bench summarization/rag
#: (2026-11-23, 18 prompts): one-token matches are right 30-35 % of the time, eight-token ones > 90 %.
#: It is the prior of each request's own running rate (``PRIOR_WEIGHT`` pseudo-observations).
MATCH_PRIOR = (0.3, 0.5, 0.65, 0.72, 0.75, 0.85, 0.87, 0.92)
PRIOR_WEIGHT = 8.0
#: a tree node's children: at most this many of the continuations its context was seen with
SUFFIX_TREE_BRANCHES = 3


class SuffixDrafter(Drafter):
    name = "suffix"
    #: its tokens cost no model step: the engine asks whatever γ its controller chose (a controller
    #: that never measures a draft step would keep choosing 1), and it proposes up to ``max_tokens``
    #: with ``prefix_accept``, so the engine's cost model picks the length verified
    has_free_tokens = True

    def __init__(self, cache: GlobalSuffixCache | None = None, max_depth: int = 8, min_confidence: float = 0.1,
                 tree_nodes: int = 0, prediction: tuple[int, ...] = (), max_tokens: int = 0,
                 only_prediction: bool = False) -> None:
        self.max_tokens = max_tokens  # the longest proposal whatever k a round asks (the request's γ maximum)
        #: draft from the prediction's table alone (the ``draft_model`` method with a predicted output:
        #: neither this request's text nor earlier requests')
        self.only_prediction = only_prediction
        self.cache = cache if cache is not None else GlobalSuffixCache(max_depth)
        self.local = FrequencyTable(max_depth)
        #: the request's predicted output (:mod:`specdec.prediction`) and its table, one of its own so
        #: that what is drafted from it can be counted (built by :meth:`start`; None without one)
        self.prediction = list(prediction)
        self.predicted: FrequencyTable | None = None
        self.prediction_accepted = self.prediction_rejected = 0
        self.min_confidence = min_confidence
        #: > 0: propose token trees of up to this many nodes (every continuation the tables saw,
        #: likeliest first, as SuffixDecoding's suffix trees do); 0: chains
        self.tree_nodes = tree_nodes
        self.proposed_parents: list[int] | None = None
        self.tokens: list[int] = []
        self.prompt_len = 0
        self._reset_rates()

    def _reset_rates(self) -> None:
        buckets = self.local.max_depth
        self.match_accepts = [PRIOR_WEIGHT * MATCH_PRIOR[min(b, len(MATCH_PRIOR) - 1)] for b in range(buckets)]
        self.match_trials = [PRIOR_WEIGHT] * buckets
        # the same for the prediction's table, learnt apart: a prediction is right for long runs or
        # (an earlier answer that went another way) hardly at all, unlike the request's own repeats
        self.prediction_accepts, self.prediction_trials = list(self.match_accepts), list(self.match_trials)
        self.proposed_depths: list[int] = []  # match length behind each token of the last proposal
        self.proposed_predicted: list[bool] = []  # which of them the prediction's table proposed
        self.proposed: list[int] = []

    def start(self, prompt_ids: list[int]) -> None:
        self.local = FrequencyTable(self.local.max_depth)
        self.tokens = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        if not self.only_prediction:
            self.local.add(self.tokens)
        if self.prediction:
            # the prediction is the expected output from its first token: it follows the prompt's last
            # tokens, so they are its first token's context (else that token could not be drafted)
            tail = self.tokens[-self.local.max_depth :]
            self.predicted = FrequencyTable(self.local.max_depth)
            self.predicted.add(tail + self.prediction, start=len(tail))
            self.prediction_accepted = self.prediction_rejected = 0
        self._reset_rates()

    @property
    def prediction_counts(self) -> tuple[int, int] | None:
        return None if not self.prediction else (self.prediction_accepted, self.prediction_rejected)

    def _predict(self, tokens: list[int], choices: int = 1) -> tuple[list[tuple[int, float]], int, bool] | None:
        """The likeliest next tokens with their acceptance estimates, the match length behind them
        and whether the prediction's table gave them: from the longest match of the tables (the
        larger top share on a tie; the prediction first among equals, so its tokens count as its)."""
        tables = ((self.predicted, True),) if self.only_prediction else (
            (self.predicted, True), (self.local, False), (self.cache, False))
        candidates = [(found, from_prediction) for table, from_prediction in tables
                      if table is not None and (found := table.predict(tokens, choices)) is not None]
        if not candidates:
            return None
        (ranked, depth), from_prediction = max(candidates, key=lambda c: (c[0][1], c[0][0][0][1]))
        bucket = self._bucket(depth)
        accepts, trials = (self.prediction_accepts, self.prediction_trials) if from_prediction else (self.match_accepts, self.match_trials)
        rate = accepts[bucket] / trials[bucket]
        return [(token, share * rate) for token, share in ranked], depth, from_prediction

    def _bucket(self, depth: int) -> int:
        return min(depth, len(self.match_trials)) - 1  # the shared cache may keep longer contexts

    def propose(self, context_ids: list[int], k: int) -> Draft:
        if len(context_ids) > len(self.tokens):
            start = len(self.tokens)
            self.tokens.extend(context_ids[start:])
            if not self.only_prediction:
                self.local.add(self.tokens, start=start)
        k = max(k, self.max_tokens)
        if self.tree_nodes:
            draft, self.proposed_depths, self.proposed_predicted = self.continuation_tree(self.tokens, k, self.tree_nodes)
        else:
            draft, self.proposed_depths, self.proposed_predicted = self.continuation(self.tokens, k)
        self.proposed, self.proposed_parents = draft.tokens, draft.parents
        return draft

    def continuation(self, tokens: list[int], k: int) -> tuple[Draft, list[int], list[bool]]:
        """Up to ``k`` tokens to follow ``tokens`` (the committed ones, or those plus tokens another
        drafter proposed) from the tables as they are, the match length behind each and whether the
        prediction gave it; learns nothing from ``tokens``, so uncommitted tokens never enter the tables."""
        walk = list(tokens[-self.local.max_depth :])
        proposal: list[int] = []
        prefix_accept: list[float] = []
        depths: list[int] = []
        predicted: list[bool] = []
        score = 1.0  # estimated probability that the whole proposal so far is accepted
        while len(proposal) < k:
            prediction = self._predict(walk)
            if prediction is None:
                break
            [(token, confidence)], depth, from_prediction = prediction
            score *= confidence
            if score < self.min_confidence:
                break
            proposal.append(token)
            prefix_accept.append(score)
            depths.append(depth)
            predicted.append(from_prediction)
            walk = (walk + [token])[-self.local.max_depth :]
        return Draft(tokens=proposal, prefix_accept=prefix_accept), depths, predicted

    def continuation_tree(self, tokens: list[int], max_depth: int, max_nodes: int) -> tuple[Draft, list[int], list[bool]]:
        """A tree of up to ``max_nodes`` tokens, ``max_depth`` deep, to follow ``tokens``: best first
        over every continuation the tables know (a node's estimate is its path's product), each
        node added before its children; the match length behind each node and whether the
        prediction gave it."""
        tokens_, parents, estimates, depths, levels, predicted = [], [], [], [], [], []
        walks: list[list[int]] = []
        frontier: list[tuple[float, int, int, int, int, bool]] = []  # (-estimate, order, parent, token, match, predicted)
        order = 0

        def expand(parent: int, walk: list[int], score: float) -> None:
            nonlocal order
            prediction = self._predict(walk, choices=SUFFIX_TREE_BRANCHES)
            if prediction is None:
                return
            ranked, depth, from_prediction = prediction
            for token, confidence in ranked:
                if score * confidence >= self.min_confidence:
                    heapq.heappush(frontier, (-score * confidence, order, parent, token, depth, from_prediction))
                    order += 1

        root_walk = list(tokens[-self.local.max_depth :])
        expand(-1, root_walk, 1.0)
        while frontier and len(tokens_) < max_nodes:
            negative, _, parent, token, depth, from_prediction = heapq.heappop(frontier)
            node = len(tokens_)
            tokens_.append(token)
            parents.append(parent)
            estimates.append(-negative)
            depths.append(depth)
            predicted.append(from_prediction)
            walk = ((walks[parent] if parent >= 0 else root_walk) + [token])[-self.local.max_depth :]
            walks.append(walk)
            levels.append(1 if parent < 0 else levels[parent] + 1)
            if levels[node] < max_depth:
                expand(node, walk, -negative)
        return Draft(tokens=tokens_, prefix_accept=estimates, parents=parents), depths, predicted

    def accepted_path(self, path: list[int], next_token: int) -> None:
        """Match-length rates after a tree: every node on the accepted path was right; the siblings
        tried before each of them, and every child of the last one, were wrong."""
        if self.proposed_parents is None:
            super().accepted_path(path, next_token)
            return
        kids = children(self.proposed_parents)
        parent = -1
        for node in [*path, None]:
            for child in kids.get(parent, []):
                if child == node:
                    break
                self._trial(child, right=False)
            if node is None:
                break
            self._trial(node, right=True)
            parent = node

    def _trial(self, node: int, right: bool) -> None:
        """Proposed token ``node`` was tried: right or wrong (its match length's rate — the
        prediction's own when the prediction gave it — and the prediction's counts)."""
        bucket = self._bucket(self.proposed_depths[node])
        if self.proposed_predicted[node]:
            self.prediction_trials[bucket] += 1
            self.prediction_accepts[bucket] += right
            self.prediction_accepted += right
            self.prediction_rejected += not right
        else:
            self.match_trials[bucket] += 1
            self.match_accepts[bucket] += right

    def count_prediction(self, tokens: list[int], predicted: list[bool], num_accepted: int, next_token: int) -> None:
        """Count the prediction's tokens among ``tokens``, which another drafter proposed from this
        table's :meth:`continuation` (draft_suffix's take-over): the first ``num_accepted`` kept."""
        accepted, rejected = count_prediction(tokens, predicted, num_accepted, next_token)
        self.prediction_accepted += accepted
        self.prediction_rejected += rejected

    def accepted(self, num_accepted: int, next_token: int) -> None:
        """Update the per-match-length acceptance rates: tokens before ``num_accepted`` were right,
        the one at it was right iff the target committed it (the engine may have cut the draft
        there, unverified), later ones were not tried. Committed tokens arrive with the next propose()."""
        for position in range(min(num_accepted + 1, len(self.proposed))):
            self._trial(position, right=position < num_accepted or self.proposed[position] == next_token)

    def finish(self) -> None:
        if len(self.tokens) > self.prompt_len and not self.only_prediction:  # learn this output (with the prompt's tail as context)
            self.cache.add_request(self.tokens[max(0, self.prompt_len - self.local.max_depth) :])
        self.tokens = []


def clear_global_caches() -> None:
    """Forget every earlier request. Benchmarks call this before each timed run: repeating a prompt
    would otherwise let its second run draft from its own first output (a near-perfect draft that
    no real request gets) — the cross-request cache pays only on traffic that really repeats."""
    with _GLOBAL_CACHES_LOCK:
        GLOBAL_CACHES.clear()


def make_suffix_drafter(res: DrafterResources) -> SuffixDrafter:
    """The shared cache is chosen by vocabulary: the tokenizer's fingerprint, else the target's vocab size.
    Every request reads it, seeded ones too: what it proposes never changes a seeded request's text
    (:mod:`specdec.seeded`), nor greedy output."""
    cache = global_cache_for(vocabulary_key(res.tokenizer, res.target_backend.config.vocab_size))
    return SuffixDrafter(cache=cache, tree_nodes=tree_nodes_for(res, reads_prediction=True), prediction=res.prediction_ids,
                         max_tokens=res.spec.max_draft_tokens(bool(res.prediction_ids)))


def vocabulary_key(tokenizer, vocab_size: int) -> str:  # noqa: ANN001 - Tokenizer | None
    """Which shared cache a target's requests use: its tokenizer's fingerprint, else its vocab size."""
    if tokenizer is not None:
        return f"tokenizer:{tokenizer.fingerprint()}"
    return f"vocab:{vocab_size}"


METHODS = (MethodInfo("suffix", make_suffix_drafter,
                      "suffix decoding over this request and a process-wide cache of earlier outputs",
                      options=("num_speculative_tokens", "spec_tree"), reads_prediction=True),)
