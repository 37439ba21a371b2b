"""Speculative decoding settings (names as in vLLM's ``speculative_config``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from specdec.errors import SpecdecError

#: what an on/off environment switch (SPECDEC_CUDA_GRAPHS, SPECDEC_HUGE_PAGES) reads as off
SWITCH_OFF = ("0", "false", "no", "off")


def env_switch(name: str) -> bool:
    """An on-by-default environment switch: off when ``name`` is one of SWITCH_OFF (any case), on otherwise.
    Read on every call, so a test or a benchmark can flip it between calls."""
    return os.environ.get(name, "1").strip().lower() not in SWITCH_OFF

#: --quantize / --draft-quantize values (api.resolve_quantize says what each means)
QUANTIZE_MODES = ("auto", "none", "int8", "int4", "int4-all")
#: train-drafter --precision values (train/precision.py chooses what auto means on this CPU)
TRAIN_PRECISIONS = ("auto", "float32", "bfloat16")

#: The method a draft model runs when none is named: the draft model, except where the request's own
#: suffix table already knows the continuation (drafters/draft_suffix.py). Measured on a 2-core Zen 4
#: (AVX-512 VNNI), γ=auto, 6 prompts per group, end to end × our plain decoding, draft_suffix vs
#: draft_model in the same runs: HumanEval 1.31 vs 1.23, GSM8K 1.14 vs 1.16, MT-Bench 1.19 vs 1.02
#: (2026-11-26); 1.21 vs 1.10, 1.17 vs 1.16, 1.29 vs 1.08 (2026-11-25). ``method="draft_model"`` is
#: the draft model alone (what vLLM's ``draft_model`` method runs).
DEFAULT_DRAFT_METHOD = "draft_suffix"
#: γ used when the user gives a drafter but no ``num_speculative_tokens``: ``"auto"`` (γ from the measured
#: acceptance and step costs each round, drafting stopped where it does not pay — what HF transformers'
#: assisted generation does by default too). Against a fixed γ=4, end to end × our plain decoding, 6 prompts
#: per group, 96 tokens, 2-core AMX Xeon (benchmarks/gamma_default.py, session 49): HumanEval and GSM8K
#: level or a little behind where the draft is well aligned (draft_suffix 1.56 vs 1.58 and 1.46 vs 1.52,
#: draft_model 1.53 vs 1.55 and 1.53 vs 1.52), MT-Bench 1.25 vs 1.01 (both methods), Spec-Bench
#: summarization draft_suffix 1.24 vs 1.18 and draft_model 0.96 vs 0.78. An integer is a fixed γ, as
#: vLLM's ``num_speculative_tokens``.
#: A server's requests too: sharing forwards, a request's γ is held to what the γ table prices at the load
#: (specdec/policy.py; under a fixed --disable-speculation-above too). `specdec serve` auto vs 4 (int8
#: target, 0.5B int4-all draft, 64 tokens, benchmarks/serve_load.py --variant, AMX Xeon, session 50, final
#: code), tokens/s at 1/2/4/8 concurrent MT-Bench requests 28.3/39.5/54.5/88.2 vs 27.3/38.0/54.9/87.6, and
#: HumanEval at 4: 58.0 and 61.0 vs 57.9 and 60.5. Planned per request alone, auto had drafted 1.3-1.4x γ=4's
#: tokens at 4 concurrent (session 49).
DEFAULT_NUM_SPECULATIVE_TOKENS: int | str = "auto"
#: each process-wide suffix table's default cap (drafters/suffix.py), in stored (context, next token) counts: up to
#: 8 of them per remembered output token, ~0.33 KB each in CPython (2M: ~0.67 GB at the worst, ~250k output tokens)
DEFAULT_SUFFIX_CACHE_ENTRIES = 2_000_000
#: Prompt tokens a draft model reads (see drafters/draft_model.py). Measured with
#: benchmarks/draft_window.py (AVX2, draft_suffix vs plain, decode speed): on 6 Spec-Bench
#: summarization/rag prompts (600-800 tokens) whole prompt 0.55x, 512 0.68x, 256 0.73x, 128 0.98x;
#: on 6 HumanEval prompts 128 1.10x (α 0.76) vs 512 1.03x (α 0.75): the draft's prompt pass costs
#: more than the context it buys
DEFAULT_DRAFT_CONTEXT_WINDOW = 128
#: a draft model scores only the first 65536 token ids (BPE ids come roughly in frequency order): for
#: the 0.5B draft's 151936-id vocabulary a 13 % cheaper step (12.5 vs 14.3 ms on a Zen 4 EPYC) for
#: 1–3 % of target tokens it cannot draft; end to end × plain, whole head → 65536 → 32768: HumanEval
#: 1.07 / 1.14 / 1.14, GSM8K 1.09 / 1.12 / 1.08, MT-Bench 0.95 / 1.03 / 0.99 (benchmarks/draft_vocab.py,
#: results 2026-11-26). Vocabularies of at most this many ids are untouched.
DEFAULT_DRAFT_VOCAB_SIZE = 65536
#: a server's prefix cache per model (specdec/prefix_cache.py), in GB: the 1.5B target's float32
#: keys/values take ~57 KB per token, so ~17 k tokens of earlier prompts
DEFAULT_PREFIX_CACHE_GB = 1.0
#: tokens per prefix-cache block (specdec/prefix_cache.py). A prompt reuses whole blocks only, so up
#: to block_size - 1 shared tokens are computed again: Qwen2.5's chat preamble (system turn and the
#: user turn's header) is 24 tokens, of which blocks of 16 kept 16 — 8 rows of every chat request's
#: prompt pass (~30 ms on the 1.5B int8 target) — and blocks of 8 keep all 24. Smaller still, the
#: per-block copies and keys start to count beside the rows saved.
DEFAULT_BLOCK_SIZE = 8
#: Largest γ ``auto`` will try; beyond this verification cost on CPU grows faster than acceptance.
AUTO_MAX_SPECULATIVE_TOKENS = 8
#: γ ``auto`` with a predicted output (:mod:`specdec.prediction`): the most tokens a round may verify
#: from it. A prediction that is right is right for long runs, whose tokens are accepted ~all, so
#: the engine's cost model (each token's estimate against the measured verify cost) sets the length.
#: Measured (int8 1.5B on a 2-core AMX Xeon, 6 HumanEval edits): 8 → 6.96× plain, 32 → see README.
AUTO_MAX_PREDICTED_TOKENS = 32
#: ``spec_tree="auto"``: the most tree nodes a round may verify, per token of γ (the engine verifies
#: fewer where the measured verify cost says the unlikely ones do not pay) …
AUTO_TREE_NODES_PER_TOKEN = 2
#: … and never more than this many
AUTO_MAX_TREE_NODES = 16
#: The default ``spec_tree``: ``auto`` trees for greedy requests, chains for sampled ones. Greedy
#: trees ran 1.00–1.15× the chain's decode speed paired per prompt (draft model and draft+suffix,
#: HumanEval and MT-Bench, AMX Xeon, session 40), 1.13× on chat and 0.95–1.01× on code one request
#: at a time in the server (sessions 41–42), and ≥ the chain on an AVX2 Zen 3 (session 22); a sampled
#: chain's alternatives ran 0.93–1.03× (sessions 38, 40): break-even at best on a CPU, so sampled
#: requests keep chains unless asked.
DEFAULT_SPEC_TREE = "greedy"
#: ``greedy`` grows trees only where one more verified row costs at most this share of a single step,
#: on average over the target's measured curve from 1 row to the largest tree's rows: an AMX int8
#: target's 1–3 % per row paid for its trees; an int4 target's ~10 % did not — 0.96–0.97× the chain
#: paired per prompt, its cost model cutting the siblings to τ 1.00–1.03× (session 42). Read to 4 rows
#: only, an AMX Xeon's int4 curve (2 % a row to 4, 7–10 % beyond) let trees grow that ran 0.94× the
#: chain on HumanEval (session 61). Unmeasured (float weights, CUDA): trees.
FLAT_VERIFY_ROW_SHARE = 0.05
#: the words ``spec_tree`` takes besides a node count
SPEC_TREE_WORDS = ("off", "auto", DEFAULT_SPEC_TREE)


def verify_is_flat(seconds: dict[int, float] | None, rows: int = 4) -> bool:
    """Does each verified row up to ``rows`` (a tree's nodes + 1) cost at most :data:`FLAT_VERIFY_ROW_SHARE`
    of a single step, on average over the measured curve (read linearly between its sizes, at most to the
    largest measured)?"""
    if not seconds or 1 not in seconds or len(seconds) < 2:
        return True
    rows = min(max(rows, 2), max(seconds))
    below, above = max(t for t in seconds if t <= rows), min(t for t in seconds if t >= rows)
    at_rows = seconds[below] if above == below else (
        seconds[below] + (seconds[above] - seconds[below]) * (rows - below) / (above - below))
    return (at_rows - seconds[1]) / (rows - 1) <= FLAT_VERIFY_ROW_SHARE * seconds[1]


@dataclass
class SpecConfig:
    """What to speculate with.

    ``method`` is a registered drafter name (``draft_model``, ``ngram`` …) or ``None`` for plain
    autoregressive decoding. ``num_speculative_tokens`` is γ, or ``"auto"`` to choose it every step
    from the measured acceptance rate and draft/verify costs.
    """

    method: str | None = None
    num_speculative_tokens: int | str = DEFAULT_NUM_SPECULATIVE_TOKENS
    draft_model: str | None = None
    #: ``auto`` stops drafting a round early once the draft's top probability falls below this.
    draft_confidence_threshold: float = 0.3
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    datastore: str | None = None  # retrieval: path of a `specdec datastore build` output
    #: layer_skip: indices to skip ("3,5,7-12" or a list), "auto" = saved calibration, None = saved
    #: calibration if any, else a default (every other layer of the upper half)
    skip_layers: str | list[int] | None = None
    exit_layer: int | None = None  # early_exit: run the first L layers (None = half)
    #: draft_model: score only the first N token ids in the draft (FR-Spec); 0 = the whole vocabulary
    draft_vocab_size: int = DEFAULT_DRAFT_VOCAB_SIZE
    #: draft_model / draft_suffix: the draft model reads at most the last N prompt tokens (0 = all);
    #: its prompt pass is paid inside decoding, so on long prompts a short window is what pays
    draft_context_window: int = DEFAULT_DRAFT_CONTEXT_WINDOW
    #: token trees (:mod:`specdec.tree`): "off" = chains; N = drafters that can branch propose
    #: trees of up to N nodes, verified in one target forward; "auto" = up to
    #: AUTO_TREE_NODES_PER_TOKEN × γ nodes (≤ AUTO_MAX_TREE_NODES), cut by the measured verify cost;
    #: "greedy" (the default) = "auto" for greedy requests, chains for sampled ones
    spec_tree: str | int = DEFAULT_SPEC_TREE
    #: eagle: the directory of a trained head (``specdec train-drafter`` writes one)
    drafter_path: str | None = None

    def __post_init__(self) -> None:
        if self.method is not None and not isinstance(self.method, str):
            raise SpecdecError(f"method must be a method's name (see `specdec methods`), got {self.method!r}")
        if self.method is not None:
            self.method = self.method.replace("-", "_")  # --method layer-skip == layer_skip
        if self.method is None and self.draft_model is not None:
            self.method = DEFAULT_DRAFT_METHOD
        k = self.num_speculative_tokens
        if isinstance(k, str):
            if k == "auto":
                pass
            elif k.isdigit():
                self.num_speculative_tokens = int(k)
            else:
                raise SpecdecError(f"num_speculative_tokens must be a positive integer or 'auto', got {k!r}")
        elif not is_int(k):  # 2.5 and True became 2 and 1; None failed later
            raise SpecdecError(f"num_speculative_tokens must be a positive integer or 'auto', got {k!r}")
        if isinstance(self.num_speculative_tokens, int) and self.num_speculative_tokens < 1:
            raise SpecdecError(
                f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens} "
                "(use no drafter for plain decoding)"
            )
        if not is_real(self.draft_confidence_threshold) or not 0.0 <= self.draft_confidence_threshold < 1.0:
            raise SpecdecError(f"draft_confidence_threshold must be in [0, 1), got {self.draft_confidence_threshold!r}")
        if not isinstance(self.draft_vocab_size, int) or self.draft_vocab_size < 0:
            raise SpecdecError(f"draft_vocab_size must be an integer >= 0 (0 = whole vocabulary), got {self.draft_vocab_size!r}")
        if not isinstance(self.draft_context_window, int) or self.draft_context_window < 0:
            raise SpecdecError(f"draft_context_window must be an integer >= 0 (0 = the whole prompt), got {self.draft_context_window!r}")
        if self.exit_layer is not None and (not isinstance(self.exit_layer, int) or self.exit_layer < 1):
            raise SpecdecError(f"exit_layer must be a positive integer, got {self.exit_layer!r}")
        tree = self.spec_tree
        if isinstance(tree, str) and tree.isdigit():
            self.spec_tree = tree = int(tree)
        if not (tree in SPEC_TREE_WORDS or (isinstance(tree, int) and not isinstance(tree, bool) and tree >= 1)):
            raise SpecdecError(f"spec_tree must be 'off', 'auto', 'greedy' or a number of tree nodes >= 1, got {tree!r}")
        if not (is_int(self.prompt_lookup_min) and is_int(self.prompt_lookup_max)
                and 1 <= self.prompt_lookup_min <= self.prompt_lookup_max):
            raise SpecdecError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {self.prompt_lookup_min}, {self.prompt_lookup_max}"
            )

    @property
    def adaptive(self) -> bool:
        return self.num_speculative_tokens == "auto"

    def max_draft_tokens(self, reads_prediction: bool) -> int:
        """The most tokens one round may verify as a chain: :attr:`max_speculative_tokens`, or under
        γ=auto for a drafter that drafts from a predicted output, AUTO_MAX_PREDICTED_TOKENS (a model
        drafter's own γ stays within the first; only table tokens, which cost no step, run longer)."""
        if reads_prediction and self.adaptive:
            return max(self.max_speculative_tokens, AUTO_MAX_PREDICTED_TOKENS)
        return self.max_speculative_tokens

    @property
    def max_speculative_tokens(self) -> int:
        k = self.num_speculative_tokens
        return AUTO_MAX_SPECULATIVE_TOKENS if k == "auto" else int(k)

    @property
    def max_tree_nodes(self) -> int:
        """The most nodes a tree round of any request verifies; 0 = chains only (what KV room and
        batch capacity are sized for; :meth:`tree_nodes` is one request's budget)."""
        if self.spec_tree == "off":
            return 0
        if self.spec_tree in ("auto", DEFAULT_SPEC_TREE):
            return min(AUTO_TREE_NODES_PER_TOKEN * self.max_speculative_tokens, AUTO_MAX_TREE_NODES)
        return int(self.spec_tree)

    def tree_nodes(self, greedy: bool, verify_seconds: dict[int, float] | None = None, reads_prediction: bool = False) -> int:
        """The most nodes a tree round verifies for a greedy (or sampled) request on a target whose
        step costs are ``verify_seconds`` (T rows → seconds; None: unmeasured); 0 = chains. A drafter
        that reads a predicted output may grow its trees as deep as its chains (:meth:`max_draft_tokens`)."""
        if self.spec_tree == DEFAULT_SPEC_TREE and not (greedy and verify_is_flat(verify_seconds, self.max_tree_nodes + 1)):
            return 0
        nodes = self.max_tree_nodes
        return max(nodes, self.max_draft_tokens(True)) if nodes and reads_prediction else nodes


def is_int(value: object) -> bool:
    """An integer that is not a bool (True passed as 1 where a count was meant)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A real number that is not a bool or NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
