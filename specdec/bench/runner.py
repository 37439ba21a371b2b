"""`specdec bench`: every method on the same prompts, interleaved per prompt, median of repeats.

Fairness rules (Spec-Bench): one warm-up generation first; for each prompt every method runs in
turn, ``repeats`` times; greedy runs compare each method's tokens with plain decoding's and flag a
difference loudly (a difference is a bug, not a result). Multi-turn MT-Bench rows run both turns
with the chat template, every run's second turn seeing plain decoding's first answer (one prompt for all).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import specdec
from specdec.api import LoadedModel, encode_prompt
from specdec.bench.datasets import PromptRow
from specdec.config import DEFAULT_SPEC_TREE, SPEC_TREE_WORDS, SpecConfig
from specdec.drafters.registry import is_plain, method_info, needs_draft_model, resolve_method
from specdec.drafters.suffix import clear_global_caches
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams

PEER_METHODS = {"hf": ["hf", "hf-assisted", "hf-pld"], "llamacpp": ["llamacpp", "llamacpp-draft"]}


def is_peer(method: str) -> bool:
    """Peers are measured, never held to our exactness check (their kernels differ)."""
    return any(method in names for names in PEER_METHODS.values())


@dataclass
class RequestResult:
    prompt_id: str
    category: str
    method: str
    repeat: int
    turn: int
    tokens: list[int]
    stats: dict[str, Any]
    wall_s: float
    mismatch: bool = False


@dataclass
class BenchConfig:
    methods: list[str]
    params: SamplingParams
    gammas: list[int | str] = field(default_factory=lambda: [4])  # several: one run per γ, named method@γ
    repeats: int = 3
    #: every run's other SpecConfig settings (datastore, drafter_path, skip_layers, draft_vocab_size,
    #: prompt_lookup_min …: the command's method flags, cli.common.method_options), each read by the
    #: methods that use it
    options: dict = field(default_factory=dict)
    #: token trees to try for the methods that branch (``"off"``: chains); each is its own run,
    #: named ``method:tree=N`` (see :func:`variant_name`); default: the library's (SpecConfig's)
    spec_trees: list[str | int] = field(default_factory=lambda: [DEFAULT_SPEC_TREE])
    #: --concurrency: how much requests in flight may draft (generate_batch's policy: N, auto, never)
    disable_speculation_above: int | str = "auto"


def variant_name(method: str, gamma: int | str, tree: str | int, several_gammas: bool) -> str:
    """A run's name in reports: ``method``, ``method@γ`` when several γ are measured, then
    ``:tree=N`` for a run whose trees are not the default's (``:tree=off`` for chains;
    :func:`parse_variant` reads it back)."""
    name = f"{method}@{gamma}" if several_gammas else method
    return name if tree == DEFAULT_SPEC_TREE else f"{name}:tree={tree}"


def parse_variant(name: str) -> tuple[str, int | str | None, str | int]:
    """``method[@γ][:tree=N]`` → (method, γ or None when not in the name, tree: a word of
    :data:`~specdec.config.SPEC_TREE_WORDS` or N; the default's when the name has none)."""
    name, _, tree_text = name.partition(":tree=")
    method, _, gamma_text = name.partition("@")
    gamma = None if not gamma_text else gamma_text if gamma_text == "auto" else int(gamma_text)
    tree: str | int = DEFAULT_SPEC_TREE if not tree_text else tree_text if tree_text in SPEC_TREE_WORDS else int(tree_text)
    return method, gamma, tree


def branches(method: str) -> bool:
    """Does this method propose token trees when ``spec_tree`` is on?"""
    return not is_peer(method) and not is_plain(method) and "spec_tree" in method_info(resolve_method(method)).options


def runs_of(method: str, config: BenchConfig) -> list[tuple[str, int | str, str | int]]:
    """A speculative method's runs in a benchmark: ``(name, γ, tree)`` for every γ of ``config`` and,
    for a method that branches, every tree of ``config.spec_trees``."""
    trees = config.spec_trees if config.spec_trees != [DEFAULT_SPEC_TREE] and branches(method) else [DEFAULT_SPEC_TREE]
    return [(variant_name(method, gamma, tree, len(config.gammas) > 1), gamma, tree)
            for gamma in config.gammas for tree in trees]


def method_needs_draft(method: str) -> bool:
    """Does this bench method name (ours or a peer's) run the draft model?"""
    if is_peer(method):
        return method in ("hf-assisted", "llamacpp-draft")
    return needs_draft_model(resolve_method(method))


def spec_for(method: str, config: BenchConfig, gamma: int | str, tree: str | int = DEFAULT_SPEC_TREE) -> SpecConfig:
    if is_plain(method):  # plain decoding reads none of the method options (they would warn as unread)
        return SpecConfig()
    return SpecConfig(method=resolve_method(method), num_speculative_tokens=gamma, spec_tree=tree, **config.options)


def run_turns(generate_one: Callable[[list[int]], tuple[list[int], dict, str]], target: LoadedModel, row: PromptRow,
              answers: list[str] | None = None) -> tuple[list[tuple[list[int], dict, float]], list[str]]:
    """Run every turn of a row; returns ((tokens, stats, wall seconds) per turn, the answers' texts). A chat row's
    later turns see ``answers`` (plain decoding's) as the earlier turns' replies where given, else this run's
    own: every method and peer then answers the same second-turn prompt (an int8 method's own first answer,
    rounded differently from the int4 plain row's, made its second turn a different prompt)."""
    messages: list[dict[str, str]] = list(row.history)  # a logged request's system prompt and earlier exchanges
    results, texts = [], []
    for index, turn in enumerate(row.turns):
        if row.chat:
            messages.append({"role": "user", "content": turn})
            ids = encode_prompt(target, messages)
        else:
            ids = encode_prompt(target, turn)
        start = time.perf_counter()
        tokens, stats, text = generate_one(ids)
        results.append((tokens, stats, time.perf_counter() - start))
        texts.append(text)
        if row.chat:
            messages.append({"role": "assistant", "content": answers[index] if answers is not None else text})
    return results, texts


def ours(target: LoadedModel, draft: LoadedModel | None, method: str, config: BenchConfig, gamma: int | str = 4,
         tree: str | int = DEFAULT_SPEC_TREE) -> Callable[[list[int]], tuple[list[int], dict, str]]:
    spec = spec_for(method, config, gamma, tree)

    def generate_one(ids: list[int]) -> tuple[list[int], dict, str]:
        out = specdec.generate(target, ids, config.params, draft=draft if needs_draft_model(spec.method) else None, spec=spec)
        return out.token_ids, out.stats.to_dict(), out.text

    return generate_one


def short_config(config: BenchConfig, tokens: int = 8) -> BenchConfig:
    """``config`` generating at most ``tokens`` tokens: the warm-up runs'."""
    return dataclasses.replace(config, params=dataclasses.replace(config.params, max_tokens=min(tokens, config.params.max_tokens)))


def method_target(method: str, target: LoadedModel, method_targets: dict[str, LoadedModel] | None) -> tuple[LoadedModel, str]:
    """The model ``method`` runs on and the plain-decoding row its outputs are checked against: ``ar`` for the
    benchmark's target, ``ar[int8]`` for a method's target in another execution mode (that mode's identity check
    and its own speed beside the others)."""
    model = (method_targets or {}).get(method, target)
    return model, "ar" if model is target else f"ar[{model.backend.mode}]"


def is_plain_row(name: str) -> bool:
    """A plain-decoding row of a benchmark: ``ar``, or ``ar[MODE]`` (:func:`method_target`)."""
    return name == "ar" or name.startswith("ar[")


def run_benchmark(target: LoadedModel, draft: LoadedModel | None, rows: list[PromptRow], config: BenchConfig,
                  peers: dict[str, Callable] | None = None, progress: bool = True,
                  method_runner: Callable | None = None, warm_up: bool = True,
                  method_targets: dict[str, LoadedModel] | None = None) -> list[RequestResult]:
    """All methods × rows × repeats, interleaved per prompt. ``method_runner`` (tests) overrides ``ours``;
    ``warm_up=False`` when the caller already warmed up (``specdec tune`` runs one row at a time).
    ``method_targets``: methods that run on another copy of the target (``--quantize auto`` picks each
    method's execution mode as ``specdec generate`` does: int8 can verify faster where int4 decodes
    faster); each such copy gets its own plain row (:func:`method_target`), which its methods' greedy
    outputs are checked against — quantization modes agree only up to rounding. Speedups stay against
    ``ar``, the target's plain decoding."""
    def make_runners(config: BenchConfig, with_peers: bool = True) -> tuple[dict[str, Callable], dict[str, str]]:
        """(runners in running order, each speculative run's plain row): plain rows first, so that every
        method's identity check has its plain tokens for the prompt."""
        plain_runners: dict[str, Callable] = {"ar": ours(target, draft, "ar", config)}
        runners: dict[str, Callable] = {}
        checked_against: dict[str, str] = {}
        for method in config.methods:
            if peers and method in peers:
                if with_peers:
                    runners[method] = peers[method]
            elif not is_plain(method):
                model, plain = method_target(method, target, method_targets)
                plain_runners.setdefault(plain, ours(model, draft, "ar", config))
                for name, gamma, tree in runs_of(method, config):
                    runners[name] = (method_runner or ours)(model, draft, method, config, gamma, tree)
                    checked_against[name] = plain
        return {**plain_runners, **runners}, checked_against

    runners, checked_against = make_runners(config)
    if rows and warm_up:
        # every variant's first call pays one-time costs (allocator, kernels, a drafter's tables) that are not the
        # method's: warming plain decoding alone charged them to each method's first measured run (0.03-0.27 s,
        # enough to flip a tree choice in tune)
        warm_ids = encode_prompt(target, rows[0].first_prompt(), chat=rows[0].chat)[:32]
        for runner in make_runners(short_config(config), with_peers=False)[0].values():
            runner(warm_ids)
        clear_global_caches()
    results: list[RequestResult] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(rows) * config.repeats * len(runners), desc="bench", unit="gen")
    for row in rows:
        for repeat in range(config.repeats):
            plain_tokens: dict[str, list[list[int]]] = {}
            plain_answers: list[str] | None = None  # "ar" runs first: every later run's chat history
            for method, runner in runners.items():
                clear_global_caches()  # no run may draft from an earlier run of the same prompt
                turns, texts = run_turns(runner, target, row, plain_answers)
                if method == "ar":
                    plain_answers = texts
                if method not in checked_against and not (peers and method in peers):
                    plain_tokens[method] = [t for t, _, _ in turns]
                against = plain_tokens.get(checked_against.get(method, ""))
                for turn, (tokens, stats, wall) in enumerate(turns):
                    mismatch = bool(config.params.is_greedy and against is not None and tokens != against[turn])
                    results.append(RequestResult(row.id, row.category, method, repeat, turn, tokens, stats, wall, mismatch))
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    return results


def run_concurrent(target: LoadedModel, draft: LoadedModel | None, rows: list[PromptRow], config: BenchConfig,
                   concurrency: int, progress: bool = True,
                   method_targets: dict[str, LoadedModel] | None = None) -> list[RequestResult]:
    """Throughput: every method runs all the rows' first turns through :func:`specdec.generate_batch`
    with ``concurrency`` requests in flight (continuous batching), methods interleaved per repeat.
    Each request's ``wall_s`` is its share of the batch's wall time (the batch's / requests), so the
    report's tokens/s is the total throughput and its speedup the throughput ratio to plain.
    ``method_targets``: as for :func:`run_benchmark` (a server's ``--quantize auto`` picks the mode per
    method for its ``--max-num-seqs``)."""
    # (name, method, γ, tree, model, the plain row its outputs are checked against); plain rows first
    variants = [("ar", "ar", 4, "off", target, "")]
    checked = []
    for method in config.methods:
        if is_peer(method):
            raise SpecdecError(f"peer {method!r} cannot run with --concurrency (peers are timed one request at a time)")
        if is_plain(method):
            continue
        model, plain = method_target(method, target, method_targets)
        if all(plain != variant[0] for variant in variants):
            variants.append((plain, "ar", 4, "off", model, ""))
        checked += [(name, method, gamma, tree, model, plain) for name, gamma, tree in runs_of(method, config)]
    variants += checked
    prompts = [encode_prompt(target, row.first_prompt(), chat=row.chat) for row in rows]
    for _, method, gamma, tree, model, _ in variants:  # a warm-up per variant: plain decoding's first batch paid 1.5 s cold
        spec = spec_for(method, config, gamma, tree)
        specdec.generate_batch(model, prompts[:concurrency], short_config(config).params, spec=spec, max_num_seqs=concurrency,
                               draft=draft if needs_draft_model(spec.method) else None)
    clear_global_caches()
    results: list[RequestResult] = []
    for repeat in range(config.repeats):
        plain_tokens: dict[str, list[list[int]]] = {}
        for name, method, gamma, tree, model, against in variants:
            clear_global_caches()
            spec = spec_for(method, config, gamma, tree)
            start = time.perf_counter()
            outs = specdec.generate_batch(model, prompts, config.params, spec=spec, max_num_seqs=concurrency,
                                          draft=draft if needs_draft_model(spec.method) else None, progress=progress,
                                          disable_speculation_above=config.disable_speculation_above)
            share = (time.perf_counter() - start) / max(len(outs), 1)
            if not against:
                plain_tokens[name] = [out.token_ids for out in outs]
            for index, (row, out) in enumerate(zip(rows, outs)):
                mismatch = bool(config.params.is_greedy and against and out.token_ids != plain_tokens[against][index])
                results.append(RequestResult(row.id, row.category, name, repeat, 0, out.token_ids, out.stats.to_dict(),
                                             share, mismatch))
    return results


def summarize(results: list[RequestResult]) -> dict[str, dict[str, dict[str, float]]]:
    """category → method → metrics (medians over repeats of per-request figures; speedup vs ``ar`` of the same requests)."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    categories = sorted({r.category for r in results}) + ["overall"]
    methods = list(dict.fromkeys(r.method for r in results))
    for category in categories:
        chosen = [r for r in results if category == "overall" or r.category == category]
        per_method: dict[str, dict[str, float]] = {}
        plain_tps = _median_tps(chosen, "ar")
        plain_decode = _median_decode_rate(chosen, "ar")
        for method in methods:
            rs = [r for r in chosen if r.method == method]
            if not rs:
                continue
            tps = _median_tps(chosen, method)
            per_method[method] = {
                "tokens_per_s": tps,
                "speedup": tps / plain_tps if plain_tps else 0.0,
                "acceptance_rate": statistics.median(r.stats.get("acceptance_rate", 0.0) for r in rs),
                "mean_accepted_len": statistics.median(r.stats.get("mean_accepted_len", 1.0) or 1.0 for r in rs),
                "ttft_s": statistics.median(r.stats.get("ttft_s", 0.0) for r in rs),
                "tpot_s": (tpot := statistics.median(_tpot(r) for r in rs)),
                # decode only (prefill excluded): what speculation changes; long prompts dilute end-to-end speedup.
                # Totals over the same requests, as the end-to-end speedup: a ratio of two medians paired different
                # prompts' times (a walkthrough: ngram "1.08x" decode where its decoding took longer in all)
                "decode_speedup": (decode / plain_decode if plain_decode and (decode := _median_decode_rate(chosen, method))
                                   else 0.0),
                "mismatches": sum(r.mismatch for r in rs),
                # a peer's outputs are never checked, and transformers' runs report no α or τ: the report shows "–"
                "identity_checked": not is_peer(method),
                # plain decoding drafts nothing: the report shows "–", not an α of 0.00
                "speculation_reported": not is_plain_row(method) and any("acceptance_rate" in r.stats for r in rs),
                "requests": len(rs),
                **_draft_forwards_per_token(rs),
            }
        table[category] = per_method
    return table


def _draft_forwards_per_token(results: list[RequestResult]) -> dict[str, float]:
    """``{"draft_forwards_per_token": F}``: draft-model forwards per drafted token over the requests
    whose drafter counted them (a ratio of sums; empty where none did). 1 for a draft model drafting
    every token; below 1 for draft_suffix, whose suffix table drafts some tokens with no forward."""
    counted = [r.stats for r in results if "draft_forwards" in r.stats]
    proposed = sum(stats.get("proposed_tokens", 0) for stats in counted)
    if not proposed:
        return {}
    return {"draft_forwards_per_token": sum(stats["draft_forwards"] for stats in counted) / proposed}


def _tpot(result: RequestResult) -> float:
    """Seconds per decoded token; peers that report only a decode rate (llama.cpp) give 1/rate."""
    if result.stats.get("tpot_s"):
        return result.stats["tpot_s"]
    rate = result.stats.get("tokens_per_s", 0.0)
    return 1.0 / rate if rate else 0.0


def _repeats(results: list[RequestResult], method: str) -> list[list[RequestResult]]:
    """``method``'s requests among ``results``, one list per repeat."""
    by_repeat: dict[int, list[RequestResult]] = {}
    for r in results:
        if r.method == method:
            by_repeat.setdefault(r.repeat, []).append(r)
    return list(by_repeat.values())


def _median_decode_rate(results: list[RequestResult], method: str) -> float:
    """Median over repeats of decoded tokens (after each request's first) / decode seconds, summed over the
    selected requests — the decode-only counterpart of :func:`_median_tps`."""
    rates = []
    for rs in _repeats(results, method):
        tokens = sum(max(len(r.tokens) - 1, 0) for r in rs)
        seconds = sum(_tpot(r) * max(len(r.tokens) - 1, 0) for r in rs)
        if tokens and seconds:
            rates.append(tokens / seconds)
    return statistics.median(rates) if rates else 0.0


def _median_tps(results: list[RequestResult], method: str) -> float:
    """Median over repeats of (total tokens / total wall time) across the selected requests."""
    rates = [sum(len(r.tokens) for r in rs) / max(sum(r.wall_s for r in rs), 1e-9) for rs in _repeats(results, method)]
    return statistics.median(rates) if rates else 0.0
