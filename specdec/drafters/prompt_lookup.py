"""Prompt lookup (n-gram) drafting: propose what followed the most recent earlier occurrence of
the last n tokens in prompt + output (Saxena 2023; vLLM ``method="ngram"``).

Zero model cost and zero extra memory beyond an index. The index maps every n-gram (n in
[min, max]) to the position right after its most recent occurrence *whose continuation is known*,
and is updated per committed token — proposing never rescans the context (O(max) per token, O(1)
per lookup). Proposals are deterministic: q is a point mass, verified exactly by the shared verifier.
"""

from __future__ import annotations

from specdec.drafters.base import Draft, Drafter, DrafterResources, MethodInfo, tree_nodes_for
from specdec.prediction import PredictionIndex, count_prediction
from specdec.tree import depths

#: trees: merge the continuations of at most this many earlier occurrences
NGRAM_TREE_MATCHES = 4
#: trees: the prior acceptance rate of a drafted token, worth this many observed trials
NGRAM_PRIOR = 0.5
NGRAM_PRIOR_WEIGHT = 4.0
#: the prior acceptance rate of a token drafted from a predicted output (a client sends one it expects to be right)
PREDICTION_PRIOR = 0.8


class PromptLookupDrafter(Drafter):
    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 4, tree_nodes: int = 0, prediction: tuple[int, ...] = (),
                 max_tokens: int = 0) -> None:
        self.min_n = min_n
        self.max_n = max_n
        #: the request's predicted output (:mod:`specdec.prediction`): looked up beside the context,
        #: preferred at an equal n-gram length; its runs, like trees, may be ``max_tokens`` long
        #: whatever k a round asks: they carry estimates (``prefix_accept``), so the engine's cost
        #: model sets their length (and a γ=auto controller, which never measures a step for them,
        #: would keep asking for 1)
        self.prediction = list(prediction)
        self.max_tokens = max_tokens
        self.predicted: PredictionIndex | None = None
        self.prediction_accepted = self.prediction_rejected = 0
        self.prediction_rate = [PREDICTION_PRIOR * NGRAM_PRIOR_WEIGHT, NGRAM_PRIOR_WEIGHT]  # accepted, trials
        self._followed: tuple[int, list[int]] | None = None  # this round's run from the prediction: (position, tokens)
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> position of the token that followed it
        #: > 0: propose trees of up to this many nodes, merging the continuations of several earlier
        #: occurrences (the most recent of the longest n-gram first); 0: one continuation
        self.tree_nodes = tree_nodes
        #: trees only: (n, position) -> the position after the previous occurrence of that n-gram
        self.earlier: dict[tuple[int, int], int] = {}
        #: trees only: this request's running rate of accepted tree tokens (a prior of NGRAM_PRIOR
        #: over NGRAM_PRIOR_WEIGHT trials), the factor per depth of a node's estimate
        self.accepted_trials, self.trials = NGRAM_PRIOR * NGRAM_PRIOR_WEIGHT, NGRAM_PRIOR_WEIGHT
        self.proposed_parents: list[int] = []

    def start(self, prompt_ids: list[int]) -> None:
        self.tokens = []
        self.index = {}
        self.earlier = {}
        self.accepted_trials, self.trials = NGRAM_PRIOR * NGRAM_PRIOR_WEIGHT, NGRAM_PRIOR_WEIGHT
        self._extend(prompt_ids)
        if self.prediction:  # its first token follows the prompt's last tokens
            self.predicted = PredictionIndex(list(prompt_ids[-self.max_n :]), self.prediction, self.min_n, self.max_n)
            self.prediction_accepted = self.prediction_rejected = 0
            self.prediction_rate = [PREDICTION_PRIOR * NGRAM_PRIOR_WEIGHT, NGRAM_PRIOR_WEIGHT]

    @property
    def prediction_counts(self) -> tuple[int, int] | None:
        return None if not self.prediction else (self.prediction_accepted, self.prediction_rejected)

    def _extend(self, new_tokens: list[int]) -> None:
        for token in new_tokens:
            position = len(self.tokens)  # ``token`` now follows every n-gram ending just before it
            for n in range(self.min_n, self.max_n + 1):
                if position >= n:
                    gram = tuple(self.tokens[position - n : position])
                    if self.tree_nodes and gram in self.index:
                        self.earlier[(n, position)] = self.index[gram]
                    self.index[gram] = position
            self.tokens.append(token)

    def propose(self, context_ids: list[int], k: int) -> Draft:
        if len(context_ids) > len(self.tokens):
            self._extend(context_ids[len(self.tokens) :])
        self._followed = None
        matched = next(((position, n) for n in range(min(self.max_n, len(self.tokens)), self.min_n - 1, -1)
                        if (position := self.index.get(tuple(self.tokens[-n:]))) is not None), None)
        found = self.predicted.find(self.tokens) if self.predicted is not None else None
        if found is not None and (matched is None or found[1] >= matched[1]):
            return self._follow(found[0], max(k, self.max_tokens))
        if self.tree_nodes:  # free tokens with estimates: as deep as the γ maximum, the engine's cost model cuts
            return self._propose_tree(max(k, self.max_tokens))
        return Draft(tokens=self.tokens[matched[0] : matched[0] + k] if matched is not None else [])

    def _follow(self, position: int, length: int) -> Draft:
        """A run of the prediction from ``position``, each token's estimate the running rate of
        prediction tokens accepted to the power of its depth."""
        assert self.predicted is not None
        run = self.predicted.tokens[position : position + length]
        rate = self.prediction_rate[0] / self.prediction_rate[1]
        self._followed = (position, run)
        return Draft(tokens=run, prefix_accept=[rate ** (depth + 1) for depth in range(len(run))])

    def accepted(self, num_accepted: int, next_token: int) -> None:
        """After a run of the prediction: its counts, its rate and where the output has got to in it."""
        if self._followed is None:
            return
        position, run = self._followed
        assert self.predicted is not None
        accepted, rejected = count_prediction(run, [True] * len(run), num_accepted, next_token)
        self.prediction_accepted += accepted
        self.prediction_rejected += rejected
        self.prediction_rate[0] += accepted
        self.prediction_rate[1] += accepted + rejected
        self.predicted.follow(position, accepted)
        self._followed = None

    def _propose_tree(self, k: int) -> Draft:
        """The continuations (``k`` tokens each) of up to NGRAM_TREE_MATCHES earlier occurrences —
        the longest n-gram's, most recent first, then shorter ones' — merged into a trie, in that
        order, so the first nodes are the chain :meth:`propose` would give; at most ``tree_nodes``.
        A node's estimate (for the engine's cost model) is the share of the matches that pass
        through it times this request's running acceptance rate to the power of its depth."""
        starts: list[int] = []
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(self.tokens) < n:
                continue
            position = self.index.get(tuple(self.tokens[-n:]))
            while position is not None and len(starts) < NGRAM_TREE_MATCHES:
                if position not in starts:
                    starts.append(position)
                position = self.earlier.get((n, position))
        tokens: list[int] = []
        parents: list[int] = []
        through: list[int] = []  # matches passing through each node
        node_of: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        for start in starts:
            parent = -1
            for token in self.tokens[start : start + k]:
                if (parent, token) not in node_of:
                    if len(tokens) >= self.tree_nodes:
                        break
                    node_of[(parent, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                    through.append(0)
                parent = node_of[(parent, token)]
                through[parent] += 1
        rate = self.accepted_trials / self.trials
        estimates = [share / len(starts) * rate ** depth for share, depth in zip(through, depths(parents))]
        self.proposed_parents = parents
        return Draft(tokens=tokens, prefix_accept=estimates, parents=parents)

    def accepted_path(self, path: list[int], next_token: int) -> None:
        """The running acceptance rate of tree tokens: each accepted node was a success; where the
        walk stopped at a node with children, one failure."""
        stop = path[-1] if path else -1
        failed = any(parent == stop for parent in self.proposed_parents)
        self.accepted_trials += len(path)
        self.trials += len(path) + failed

    def finish(self) -> None:
        self.tokens = []
        self.index = {}
        self.earlier = {}


def make_prompt_lookup_drafter(res: DrafterResources) -> PromptLookupDrafter:
    return PromptLookupDrafter(res.spec.prompt_lookup_min, res.spec.prompt_lookup_max, tree_nodes_for(res),
                               res.prediction_ids, res.spec.max_draft_tokens(bool(res.prediction_ids)))


METHODS = (MethodInfo("ngram", make_prompt_lookup_drafter, "prompt lookup: what followed the last n tokens earlier in the context",
                      aliases=("prompt_lookup",), options=("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "spec_tree"),
                      reads_prediction=True),)
