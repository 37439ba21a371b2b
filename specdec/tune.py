"""`specdec tune`: which drafter and γ pay on *your* prompts, on *this* machine — measured, not guessed.

Seed 004's advice, automated: benchmark acceptance against representative traffic, then configure.
The best configuration changes with the CPU (int4 + draft_suffix was fastest on an AVX2 machine and
ran at 0.96× plain on an AVX-512 one) and with the traffic (suffix 1.1× on fresh code, 1.7× on
summaries), so tune runs every candidate method that applies — each γ asked for — interleaved with
plain decoding on the user's prompts (the ``specdec bench`` runner, one prompt at a time), and picks
the exact configuration with the best end-to-end speedup; plain decoding when nothing pays.

It stops starting new prompts when ``budget_s`` is spent (at least two are always measured), and
each finished prompt is appended to ``measurements.jsonl`` in the output folder, so an interrupted
run resumes where it stopped (measurements from another setup in that file are ignored).
Execution modes: the methods are measured in the modes ``--quantize auto`` picks from step-cost
curves timed on this machine (with a prior α). Once α is measured, :func:`mode_rates` puts it into
the same curves, per target mode (with the draft forwards measured per drafted token); when another
mode is expected to be faster by
:data:`MIN_SPEEDUP`, the CLI measures the chosen method again in that mode on the same prompts and
keeps the mode that measured faster. A speculative choice is measured in the other mode whatever the
expectation says (:func:`mode_to_measure`: it misses what long drafts gain where verification is flat).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from specdec.api import LoadedModel
from specdec.bench.datasets import PromptRow
from specdec.bench.report import slowed_runs
from specdec.bench.runner import BenchConfig, RequestResult, parse_variant, run_benchmark, summarize
from specdec.errors import SpecdecError
from specdec.config import DEFAULT_SPEC_TREE, SpecConfig
from specdec.cost_model import ModeChoice, choose_mode
from specdec.step_costs import ExecutionPlan
from specdec.threads import chosen_threads

#: the selected configuration must beat plain decoding by this factor, or tune picks plain decoding
#: (a 2 % "win" on a handful of prompts is inside the noise of these machines)
MIN_SPEEDUP = 1.03
#: the share of ``--budget-minutes`` the first pass may start prompts in when another target mode may
#: be measured after it (the chosen configuration alone, on the same prompts: about a third of the
#: first pass's time with one method and two trees), so the whole run stays near the budget
FIRST_PASS_SHARE = 0.75


def distinct_trees(trees: list[str | int], gammas: list[int | str],
                   verify_seconds: dict[int, float] | None) -> tuple[list[str | int], list[tuple[str | int, str | int]]]:
    """The tree settings that verify differently on this target for tune's greedy requests, and each one left out
    with the setting it equals: those that run chains at every γ are one (``greedy`` grows trees only where the
    target's verify curve is flat: elsewhere it *is* ``off``, and tune timed the same chains twice under two names
    and chose between them on noise — a walkthrough: 1.52x vs 1.14x). Of equal settings the library's default is
    kept (it adapts where the curve is flat: a later machine, or the curve re-measured). Settings that grow trees
    stay apart (``auto`` and N nodes budget them differently)."""
    kept: dict[object, str | int] = {}
    left_out: list[tuple[str | int, str | int]] = []
    for tree in dict.fromkeys(trees):  # a setting given twice is one
        chains = all(SpecConfig(num_speculative_tokens=gamma, spec_tree=tree).tree_nodes(True, verify_seconds) == 0
                     for gamma in gammas)
        key = "chains" if chains else tree
        if key not in kept:
            kept[key] = tree
        elif tree == DEFAULT_SPEC_TREE:
            left_out.append((kept[key], tree))
            kept[key] = tree
        else:
            left_out.append((tree, kept[key]))
    return [tree for tree in dict.fromkeys(trees) if tree in kept.values()], left_out


def candidate_methods(has_draft: bool, has_datastore: bool) -> list[str]:
    """Every registered method that runs without per-model calibration: the draft-free ones, those
    of the draft model when one is given, retrieval when a datastore is."""
    methods = ["ngram", "suffix"]
    if has_draft:
        methods += ["draft_model", "draft_suffix"]
    if has_datastore:
        methods.append("retrieval")
    return methods


def run_tune(target: LoadedModel, draft: LoadedModel | None, rows: list[PromptRow], config: BenchConfig,
             out_dir: Path, budget_s: float, setup: dict[str, Any],
             on_row: Callable[[str], None] | None = None) -> tuple[list[RequestResult], int, int]:
    """Measure ``rows`` (every method of ``config`` and plain decoding, interleaved) until the budget
    is spent; returns the results, how many prompts were left out for lack of budget and how many were
    reused. ``setup`` identifies the measurement (:class:`MeasurementStore`): prompts stored under the same setup,
    with the same text (:func:`prompt_key`), are reused instead of measured again — unless other processes took
    cores during one of their runs (:func:`slowed`)."""
    store = MeasurementStore(out_dir, setup)
    most = store.most_threads()
    results: list[RequestResult] = []
    start = time.perf_counter()
    warmed = False
    measured = reused = 0
    for index, row in enumerate(rows):
        stored = store.reusable(row, most)
        if stored is not None:
            results.extend(stored)
            measured += 1
            reused += 1
        else:
            if measured >= 2 and time.perf_counter() - start > budget_s:
                return results, len(rows) - index, reused
            # the bench runner's warm-up, once for the whole run rather than once per prompt
            row_results = run_benchmark(target, draft, [row], config, progress=False, warm_up=not warmed)
            warmed = True
            store.add(row, row_results)
            results.extend(row_results)
            measured += 1
        if on_row is not None:
            on_row(row.id)
    return results, 0, reused


def prompt_key(row: PromptRow) -> str:
    """What a stored measurement is reused for: the prompt's id *and* text (a JSONL's id is its line number, so
    a file edited or replaced under the same --out reused another prompt's measurement, without a word)."""
    digest = hashlib.sha256(json.dumps([row.turns, row.chat] + ([row.history] if row.history else [])).encode()).hexdigest()[:16]
    return f"{row.id}:{digest}"


def slowed(row_results: list[RequestResult], most: int = 0) -> bool:
    """Did other processes take cores during one of a prompt's runs — it ran on fewer threads than ``most`` (the
    most any stored run had, as the report's busy note counts) or than another of its runs (the thread governor,
    specdec/threads.py)? A neighbour that held a core through a whole prompt leaves all its runs alike."""
    return slowed_runs(row_results, most)[0] > 0


class MeasurementStore:
    """Prompts measured under one ``setup`` (models, modes, methods, γ, tokens), appended to
    ``out_dir/measurements.jsonl`` as each finishes, so an interrupted or repeated run reuses them; entries of
    another setup in the file are ignored (tune's second pass keeps its own setup there)."""

    def __init__(self, out_dir: Path, setup: dict[str, Any]) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "measurements.jsonl"
        self.setup = setup
        self.done: dict[str, list[RequestResult]] = {}
        self.other_setups: list[dict[str, Any]] = []  # the file's entries of other setups (their setups, in order)
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut by an interruption: that prompt is measured again
            if entry.get("setup") == setup:
                self.done[entry["prompt"]] = [RequestResult(**r) for r in entry["results"]]
            elif isinstance(entry.get("setup"), dict):
                self.other_setups.append(entry["setup"])

    def setup_change(self) -> str | None:
        """Why nothing stored is reused, where the file holds only other setups' prompts: the settings that differ
        (``execution: ['int4', 'int8'] → ['int4', 'int4']``: --quantize auto timed the draft's modes the other way
        round this time). None where something is reused or nothing was stored. (The same command with the same
        --out measured everything again without a word.)"""
        if self.done or not self.other_setups:
            return None

        def changes(earlier: dict[str, Any]) -> list[str]:
            return [f"{key}: {earlier.get(key)!r} → {self.setup.get(key)!r}" for key in sorted(earlier.keys() | self.setup.keys())
                    if earlier.get(key) != self.setup.get(key)]

        # the closest earlier setup, the latest of equals: the file also holds tune's second pass, whose setup has
        # keys of its own (pass, mode, method …) that would bury the one real change
        closest = min(reversed(self.other_setups), key=lambda earlier: len(changes(earlier)))
        return "; ".join(changes(closest)) or None

    def most_threads(self) -> int:
        """The most threads any stored run had, or the count this process chose where more (what :func:`slowed`
        compares a prompt's runs with): a neighbour that held a core through every stored run left them all below it."""
        return max([chosen_threads(), *(r.stats.get("threads_max", 0) for stored in self.done.values() for r in stored)])

    def reusable(self, row: PromptRow, most: int) -> list[RequestResult] | None:
        """The row's stored results, unless there are none or other processes slowed one of its runs (a slowed
        plain run lowered the baseline, and the rerun the report advised reused it)."""
        stored = self.done.get(prompt_key(row))
        return None if stored is None or slowed(stored, most) else stored

    def add(self, row: PromptRow, results: list[RequestResult]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"setup": self.setup, "prompt": prompt_key(row), "results": [asdict(r) for r in results]}) + "\n")
        self.done[prompt_key(row)] = results


def choose(results: list[RequestResult]) -> tuple[str | None, int | str | None, str | int, dict[str, Any]]:
    """The configuration to use: ``(method, γ, token tree, its overall figures)``; ``(None, None,
    "off", plain's figures)`` when nothing beats plain decoding by :data:`MIN_SPEEDUP` or any greedy
    output differed."""
    overall = summarize(results)["overall"]
    best_name, best = None, overall["ar"]
    for name, figures in overall.items():
        if name == "ar" or figures["mismatches"]:
            continue
        if figures["speedup"] >= MIN_SPEEDUP and figures["speedup"] > best.get("speedup", 1.0):
            best_name, best = name, figures
    if best_name is None:
        return None, None, "off", best
    method, gamma, tree = parse_variant(best_name)  # "method@γ:tree=N" when several γ / trees were measured
    return method, gamma, tree, best


def mode_rates(plan: ExecutionPlan, method: str | None, acceptance_rate: float,
               draft_forwards_per_token: float = 1.0) -> ModeChoice | None:
    """Expected tokens/s per target execution mode with the *measured* α of ``method`` (plain
    decoding when None) and its drafting cost: nothing for table drafters; for model drafters the
    draft model's measured step times the draft forwards it measured per drafted token
    (``draft_forwards_per_token``, :func:`specdec.bench.runner.summarize`). Priced at one step per
    token, draft_suffix — whose suffix table drafts much of code for free — looked no faster on an
    AMX Xeon's int8 target (flat verification, so longer drafts) than on int4, where it measured
    1.24× faster on HumanEval (session 43), so tune never measured it. None when there was no choice
    of mode to make."""
    if plan.choice is None:
        return None
    from specdec.drafters.registry import needs_draft_model

    draft_seconds = 0.0
    if method is not None and needs_draft_model(method) and plan.draft_mode in plan.draft_curves:
        draft_seconds = plan.draft_curves[plan.draft_mode].cost(1) * max(0.0, draft_forwards_per_token)
    return choose_mode(plan.choice.curves, None if method is None else acceptance_rate, draft_seconds)


def faster_mode(choice: ModeChoice | None, measured_mode: str) -> str | None:
    """The mode worth measuring too: expected at least :data:`MIN_SPEEDUP` times the measured one's rate."""
    if choice is None or choice.mode == measured_mode or measured_mode not in choice.rates:
        return None
    return choice.mode if choice.rates[choice.mode] >= MIN_SPEEDUP * choice.rates[measured_mode] else None


def mode_to_measure(choice: ModeChoice | None, measured_mode: str, method: str | None) -> str | None:
    """The other target mode to measure the chosen configuration in: one expected faster
    (:func:`faster_mode`) — and for a speculative configuration the best other mode whatever its
    expected rate. Why: the expectation prices a draft with one α, as if each token were accepted
    independently, but copies and easy code are accepted in runs, so where verification is flat
    (int8 on AMX tiles) γ=auto drafts long and gains more than that predicts. Measured on an AMX Xeon
    (session 44, HumanEval, draft_suffix γ=auto): int8 expected 0.92× int4, measured 1.17–1.6×. Plain
    decoding's expectation is its measured single step: no second measurement needed."""
    expected = faster_mode(choice, measured_mode)
    if expected is not None or method is None or choice is None:
        return expected
    others = [mode for mode in choice.rates if mode != measured_mode]
    return max(others, key=lambda mode: choice.rates[mode]) if others else None


def against_plain(modes: dict[str, Any], chosen_mode: str) -> float:
    """The chosen configuration's speedup over the plain decoding a user gets — auto's plain mode, timed in the
    second pass beside it (tune.json's ``measured.execution_modes``: ``plain_tok_s`` is that mode's). The first
    pass's plain run is in the speculative target's mode (int8), slower than int4 plain where int4's single step
    is cheaper, so its ratios overstate the gain (1.71x against int8 plain was ~1.27x against int4's)."""
    return modes["measured_tok_s"][chosen_mode] / modes["plain_tok_s"]


def settle_against_plain(modes: dict[str, Any], method: str | None, gamma: int | str | None, tree: str | int,
                         target_mode: str, figures: dict[str, Any]) -> tuple[str | None, int | str | None, str | int, str,
                                                                              dict[str, Any], str]:
    """The choice once the second pass timed plain decoding in auto's plain mode (``modes``: tune.json's
    ``measured.execution_modes``): its speedup against that (:func:`against_plain`), and plain decoding when it is
    under :data:`MIN_SPEEDUP` there — it beat only the speculative mode's slower plain run (``modes`` then says plain
    was chosen). Returns (method, γ, tree, target mode, figures, a note for the verdict). Without that pass (the
    budget was spent first) the first pass's figures stand, and the note says what they are against."""
    if not modes.get("plain_tok_s"):
        note = f" (against plain decoding in {modes['measured_in']}: {modes['note']})" if modes.get("note") else ""
        return method, gamma, tree, target_mode, figures, note
    plain_tok_s, plain_mode = modes["plain_tok_s"], modes["plain_mode"]
    figures = dict(figures, speedup=against_plain(modes, target_mode))
    if method is not None and figures["speedup"] < MIN_SPEEDUP:
        modes["chosen"], modes["plain_chosen"] = plain_mode, True
        note = f": {method} ran {figures['speedup']:.2f}× plain decoding in {plain_mode} ({plain_tok_s:.1f} tok/s), timed beside it"
        return None, None, "off", plain_mode, {"speedup": 1.0, "acceptance_rate": 0.0}, note
    note = (f" with the target in {target_mode} ({modes['measured_tok_s'][target_mode]:.1f} tok/s), against plain "
            f"decoding in {plain_mode} ({plain_tok_s:.1f} tok/s, timed beside it)")
    return method, gamma, tree, target_mode, figures, note


def config_file(method: str | None, gamma: int | str | None, default_gamma: int | str, settings: dict[str, Any],
                figures: dict[str, Any], summary: dict, measured: dict[str, Any], tree: str | int = "off") -> dict[str, Any]:
    """What ``--config FILE`` reads (``settings``: flag destinations → values) and what was measured."""
    chosen = dict(settings)
    chosen["method"] = method
    chosen["num_speculative_tokens"] = None if method is None else (gamma or default_gamma)
    chosen["spec_tree"] = tree
    if method is None:  # plain decoding reads no tree setting: generate and serve warned about a flag nobody typed
        chosen.pop("spec_tree")
    if method is None or method not in ("draft_model", "draft_suffix"):
        chosen["draft_model"] = None
        chosen.pop("draft_quantize", None)  # read only with a draft model: --config warned it was not read
    return {"settings": chosen, "measured": {**measured, "speedup": round(figures.get("speedup", 1.0), 3),
                                             "acceptance_rate": round(figures.get("acceptance_rate", 0.0), 3),
                                             "table": summary}}


def read_settings(path: Path) -> dict[str, Any]:
    """The ``settings`` of a file ``specdec tune`` wrote (for ``--config``); a folder means its ``tune.json`` (tune's
    --out: "cannot read tune-out: Is a directory" answered the natural first try)."""
    if Path(path).is_dir() and (Path(path) / "tune.json").is_file():
        path = Path(path) / "tune.json"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecdecError(f"--config: no such file: {path}") from None
    except OSError as exc:  # a folder, no permission
        raise SpecdecError(f"--config: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SpecdecError(f"--config: {path} is not JSON ({exc})") from None
    settings = data.get("settings") if isinstance(data, dict) else None
    if not isinstance(settings, dict):
        raise SpecdecError(f"--config: {path} has no 'settings' object (write it with `specdec tune`)")
    return settings
