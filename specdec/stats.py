"""Per-request and aggregate statistics (metric names as in ARCHITECTURE.md, used everywhere).

The engine records; the CLI, the benchmark and the server only format. Times are wall-clock seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable


def acceptance_trials(proposed: int, accepted: int) -> int:
    """The Bernoulli trials a round that drafted ``proposed`` tokens saw: verification stops at the
    first rejection, so ``accepted + 1`` of them (all, when every one was accepted). α is accepted
    over trials, summed over rounds (a ratio of sums: averaging per-round ratios biases it low)."""
    return min(accepted + 1, proposed)


@dataclass
class Round:
    """One target forward of the decode phase, as the acceptance view draws it: the drafter's
    proposal, how much of it the target accepted, grammar-forced tokens accepted after it
    (structured output), and the tokens the round committed (the accepted ones, then the
    correction — or the bonus token when everything was accepted)."""

    drafted: list[int]
    accepted: int
    forced: int
    committed: list[int]
    #: a token tree's round (None: a chain's): the depth of its first-choice chain (each node's first
    #: child, from the root) and how many of those nodes the accepted path ran through before leaving it
    first_choices: tuple[int, int] | None = None

    def chain_trials(self) -> tuple[int, int]:
        """(accepted, acceptance trials) of this round as a chain of the drafter's first choices saw them:
        the α a γ planned for chains is planned with (the server's table under load, where trees are held to
        a chain's rows). A tree's path through a second choice is a rejection there, and a tree's depth is
        not its trials: counted so, a tree drafter's chat traffic read α 0.80-0.93 where its chains were
        accepted at 0.5-0.6, and the table drafted at 8 concurrent requests that ran 0.87x plain (session 50)."""
        if self.first_choices is None:
            return self.accepted, acceptance_trials(len(self.drafted), self.accepted)
        depth, accepted = self.first_choices
        return accepted, acceptance_trials(depth, accepted)


def position_counts(rounds: "list[Round]") -> tuple[list[int], list[int]]:
    """(drafted, accepted) per draft position j = 1, 2, …: how many rounds drafted a j-th token and
    how many of those accepted it. α_j = accepted[j] / drafted[j]; counts (not ratios) so runs add up."""
    longest = max((len(r.drafted) for r in rounds), default=0)
    drafted = [sum(len(r.drafted) > j for r in rounds) for j in range(longest)]
    accepted = [sum(r.accepted > j for r in rounds) for j in range(longest)]
    return drafted, accepted


@dataclass
class Stats:
    """What one generation measured (``GenerationResult.stats``; the server's ``usage.speculative``).

    The figures to read first: ``acceptance_rate`` (α: accepted / proposed draft tokens; 0 without a
    drafter), ``mean_accepted_len`` (τ: tokens committed per target forward, ≥ 1, plain decoding's 1),
    ``tokens_per_s`` (decode speed after the first token), ``ttft_s`` (time to the first token),
    ``draft_cost_ratio`` (a draft token's time ÷ a verification's) and ``achieved_gb_per_s`` (weights and
    keys/values read per second, against the memory's limit). ``to_dict()`` has them all; the fields are the counts and
    times they come from (README "Metrics")."""

    method: str = "ar"
    dtype: str = "float32"
    prompt_tokens: int = 0
    #: of those, tokens whose keys/values came from the prefix cache (specdec/prefix_cache.py)
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    target_forwards: int = 0  # decode-phase verification passes (prefill not counted)
    #: tokens those passes committed: the output's after the first, plus the stop token that ended it
    #: (generated_tokens does not count it, so τ from it fell below 1); nothing after it
    committed_tokens: int = 0
    proposed_tokens: int = 0  # draft tokens sent to verification
    accepted_tokens: int = 0  # of those, accepted
    #: draft tokens accepted per step → steps (a dict, not a Counter: dataclasses.asdict rebuilt a Counter from
    #: its items and counted the (key, count) pairs)
    accepted_len_histogram: dict[int, int] = field(default_factory=dict)
    prefill_time_s: float = 0.0
    ttft_s: float = 0.0
    decode_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    total_time_s: float = 0.0
    weight_bytes: int = 0  # target weights read per forward, for achieved bandwidth
    draft_weight_bytes: int = 0
    #: the target's cached keys/values a token adds (read by every later forward's attention), and what the
    #: decode forwards read of them in all: at a 3k-token context ~17 % of a step's bytes on the 1.5B int4 target
    kv_bytes_per_token: int = 0
    kv_bytes_read: int = 0
    #: draft-model forwards, where the drafter counts them (draft_suffix drafts some rounds without
    #: one); None = one per proposed token
    draft_forwards: int | None = None
    gamma_history: list[int] = field(default_factory=list)
    #: structured output: tokens the grammar alone decided, appended to drafts and verified in the
    #: same forward (always accepted; not counted in proposed/accepted, so α stays the drafter's)
    grammar_forced_tokens: int = 0
    #: every decode round in order (a few ints each; :mod:`specdec.acceptance_view` draws them)
    rounds: list[Round] = field(default_factory=list, repr=False)  # (a repr of 10 tokens was 3 KB of rounds)
    #: token trees (specdec/tree.py): rounds that verified a tree, their nodes in all, and the
    #: rounds whose accepted path went through a node that was not its parent's first child (the
    #: rounds a chain of the first choices would have lost); the path lengths are accepted_len_histogram
    tree_rounds: int = 0
    tree_nodes: int = 0
    tree_branch_wins: int = 0
    #: sampled chains with alternatives (specdec.alternatives): rounds an alternative won, and the
    #: wins their estimates promised where they were tried
    alternative_wins: int = 0
    alternative_promised: float = 0.0
    #: why a request with a drafter did not draft, when it was decided up front ("" otherwise)
    speculation_note: str = ""
    #: a predicted output (``SamplingParams.prediction``) read by the drafter: its tokens the target
    #: kept and those it checked and refused; None without one or where the method does not read it
    prediction_counts: tuple[int, int] | None = None
    #: the fewest and most CPU threads the forwards ran on (they follow the cores other processes leave:
    #: specdec/threads.py); None on a GPU
    threads: tuple[int, int] | None = None

    def note_threads(self, threads: int | None) -> None:
        """The CPU threads a forward ran on (None on a GPU): their range is part of what a tokens/s figure
        means — a busy neighbour's core given up halves the threads (specdec/threads.py)."""
        if threads is None:
            return
        self.threads = (min(self.threads[0], threads), max(self.threads[1], threads)) if self.threads else (threads, threads)

    def record_step(self, proposed: int, accepted: int, draft_s: float, verify_s: float, committed: int) -> None:
        self.target_forwards += 1
        self.kv_bytes_read += self.kv_bytes_per_token * (self.prompt_tokens + self.committed_tokens)  # the cache before it
        self.committed_tokens += committed
        self.proposed_tokens += proposed
        self.accepted_tokens += accepted
        self.accepted_len_histogram[accepted] = self.accepted_len_histogram.get(accepted, 0) + 1
        self.draft_time_s += draft_s
        self.verify_time_s += verify_s
        self.gamma_history.append(proposed)

    def record_tree(self, nodes: int, path: list[int], parents: list[int]) -> None:
        self.tree_rounds += 1
        self.tree_nodes += nodes
        first_children = {parents.index(parent) for parent in set(parents)}  # lowest index per parent
        self.tree_branch_wins += any(node not in first_children for node in path)

    # --- derived metrics -------------------------------------------------------------------------
    @property
    def acceptance_rate(self) -> float:
        """α: accepted draft tokens / proposed draft tokens."""
        return self.accepted_tokens / self.proposed_tokens if self.proposed_tokens else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """τ: tokens committed per target forward in the decode phase (includes the bonus/correction;
        at least 1: every forward commits one). 1 when the prompt pass's token was the whole answer."""
        if not self.target_forwards:
            return 1.0 if self.generated_tokens else 0.0
        return self.committed_tokens / self.target_forwards

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens after the first / time after the first token."""
        decode_tokens = self.generated_tokens - 1
        return decode_tokens / self.decode_time_s if decode_tokens > 0 and self.decode_time_s > 0 else 0.0

    @property
    def tpot_s(self) -> float:
        decode_tokens = self.generated_tokens - 1
        return self.decode_time_s / decode_tokens if decode_tokens > 0 else 0.0

    @property
    def overhead_time_s(self) -> float:
        return max(self.decode_time_s - self.draft_time_s - self.verify_time_s, 0.0)

    @property
    def draft_cost_ratio(self) -> float:
        """c: time per drafted token / time per target forward, as measured (0 without drafting).
        Speculation can pay only while c is well below the acceptance gain; see adaptive.py."""
        if not self.proposed_tokens or not self.verify_time_s:
            return 0.0
        return (self.draft_time_s / self.proposed_tokens) / (self.verify_time_s / self.target_forwards)

    @property
    def achieved_gb_per_s(self) -> float:
        """Bytes streamed per second in the decode phase (gpt-fast's figure of merit): weights and the
        target's keys/values.

        Each target forward reads the target's weights once and its cache up to the context so far (at
        long contexts a weights-only figure read far below the memory's limit while the steps were at it);
        the draft's weights are added per draft forward (counted by the drafter, else one per proposed
        token). Not counted, so the figure is a lower bound: the draft's cache reads (a draft model's
        windowed cache; layer_skip/early_exit read the target's over their layers), and on a CUDA-graph
        replay the rest of the cache's storage, which its attention reads masked."""
        if self.decode_time_s <= 0:
            return 0.0
        draft_forwards = self.proposed_tokens if self.draft_forwards is None else self.draft_forwards
        moved = self.target_forwards * self.weight_bytes + draft_forwards * self.draft_weight_bytes + self.kv_bytes_read
        return moved / self.decode_time_s / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "dtype": self.dtype,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "target_forwards": self.target_forwards,
            "committed_tokens": self.committed_tokens,
            "proposed_tokens": self.proposed_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_len": round(self.mean_accepted_len, 4),
            "accepted_len_histogram": {int(k): v for k, v in sorted(self.accepted_len_histogram.items())},
            "ttft_s": round(self.ttft_s, 4),
            "tpot_s": round(self.tpot_s, 5),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "achieved_gb_per_s": round(self.achieved_gb_per_s, 2),
            "prefill_time_s": round(self.prefill_time_s, 4),
            "decode_time_s": round(self.decode_time_s, 4),
            "draft_time_s": round(self.draft_time_s, 4),
            "verify_time_s": round(self.verify_time_s, 4),
            "overhead_time_s": round(self.overhead_time_s, 4),
            "draft_cost_ratio": round(self.draft_cost_ratio, 4),
            "total_time_s": round(self.total_time_s, 4),
            "grammar_forced_tokens": self.grammar_forced_tokens,
            "weight_bytes": self.weight_bytes,
            "draft_weight_bytes": self.draft_weight_bytes,
            "kv_bytes_read": self.kv_bytes_read,
            "gamma_history": list(self.gamma_history),
            # draft-model forwards where the drafter counts them: draft_suffix drafts some tokens from its
            # suffix table for free, which a mode choice must not price as draft steps (specdec.tune)
            **({"draft_forwards": self.draft_forwards} if self.draft_forwards is not None else {}),
            **dict(zip(("drafted_at_position", "accepted_at_position"), position_counts(self.rounds))),
            **({"tree_rounds": self.tree_rounds, "tree_nodes_per_round": round(self.tree_nodes / self.tree_rounds, 3),
                "tree_branch_wins": self.tree_branch_wins} if self.tree_rounds else {}),
            **({"alternative_wins": self.alternative_wins, "alternative_promised": round(self.alternative_promised, 3)}
               if self.alternative_promised else {}),
            # why a speculative method did not draft (γ=auto judged its prompt pass not worth it): a bench
            # row with α 0 must say so, not look like a drafter that never agreed with the target
            **({"speculation_note": self.speculation_note} if self.speculation_note else {}),
            **(dict(zip(("threads_min", "threads_max"), self.threads)) if self.threads is not None else {}),
            **(dict(zip(("prediction_accepted_tokens", "prediction_rejected_tokens"), self.prediction_counts))
               if self.prediction_counts is not None else {}),
        }

    def summary_line(self) -> str:
        """One human line for stderr: what a user wants to read after a generation."""
        parts = [
            f"method={self.method}",
            f"dtype={self.dtype}",
            f"prompt_tokens={self.prompt_tokens}",
            f"generated={self.generated_tokens}",
            f"ttft={self.ttft_s:.3f}s",
            f"{self.tokens_per_s:.2f} tok/s decode",
            f"{self.achieved_gb_per_s:.1f} GB/s",
        ]
        if self.threads is not None:
            fewest, most = self.threads
            parts.append(f"threads={most}" if fewest == most else f"threads={fewest}-{most} (other processes took cores)")
        if self.proposed_tokens:
            parts += [
                f"acceptance_rate={self.acceptance_rate:.2f}",
                f"mean_accepted_len={self.mean_accepted_len:.2f}",
                f"draft={self.draft_time_s:.2f}s verify={self.verify_time_s:.2f}s other={self.overhead_time_s:.2f}s",
                f"draft_cost_ratio={self.draft_cost_ratio:.2f}",
            ]
        if self.tree_rounds:
            parts.append(f"tree: {self.tree_nodes / self.tree_rounds:.1f} nodes/round, "
                         f"{self.tree_branch_wins}/{self.tree_rounds} rounds won by a non-first branch")
        if self.prediction_counts is not None:
            parts.append(f"prediction: {self.prediction_counts[0]} tokens accepted, {self.prediction_counts[1]} rejected")
        if self.speculation_note:
            parts.append(self.speculation_note)
        return " | ".join(parts)


def aggregate(stats: Iterable[Stats]) -> dict[str, Any]:
    """Totals over requests: rates are ratios of sums (not means of ratios), as Spec-Bench reports."""
    items = list(stats)
    if not items:
        return {}
    total = Stats(method=items[0].method, dtype=items[0].dtype)
    draft_forwards = 0
    for s in items:
        total.prompt_tokens += s.prompt_tokens
        total.cached_prompt_tokens += s.cached_prompt_tokens
        total.generated_tokens += s.generated_tokens
        total.target_forwards += s.target_forwards
        total.committed_tokens += s.committed_tokens
        total.proposed_tokens += s.proposed_tokens
        total.accepted_tokens += s.accepted_tokens
        for accepted, steps in s.accepted_len_histogram.items():
            total.accepted_len_histogram[accepted] = total.accepted_len_histogram.get(accepted, 0) + steps
        total.decode_time_s += s.decode_time_s
        total.draft_time_s += s.draft_time_s
        total.verify_time_s += s.verify_time_s
        total.total_time_s += s.total_time_s
        total.ttft_s += s.ttft_s
        total.tree_rounds += s.tree_rounds
        total.tree_nodes += s.tree_nodes
        total.tree_branch_wins += s.tree_branch_wins
        total.alternative_wins += s.alternative_wins
        total.alternative_promised += s.alternative_promised
        total.weight_bytes, total.draft_weight_bytes = s.weight_bytes, s.draft_weight_bytes
        total.kv_bytes_read += s.kv_bytes_read
        draft_forwards += s.proposed_tokens if s.draft_forwards is None else s.draft_forwards
        if s.threads is not None:
            total.note_threads(s.threads[0])
            total.note_threads(s.threads[1])
    total.draft_forwards = draft_forwards
    result = total.to_dict()
    # per-request decode tokens = generated - 1, so the totals' "-1" must count every request
    decode_tokens = total.generated_tokens - len(items)
    result["tokens_per_s"] = round(decode_tokens / total.decode_time_s, 3) if total.decode_time_s else 0.0
    result["ttft_s"] = round(total.ttft_s / len(items), 4)
    result["requests"] = len(items)
    return result
