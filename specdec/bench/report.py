"""Bench output: results.json (every request), report.md (Spec-Bench table shape), PNG plots,
and the difference between two runs."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specdec.bench.runner import RequestResult, is_peer, parse_variant, summarize
from specdec.drafters.registry import resolve_method
from specdec.engine import DRAFT_MODEL_SITS_OUT
from specdec.errors import SpecdecError
from specdec.threads import chosen_threads


def write_results(out_dir: Path, results: list[RequestResult], meta: dict[str, Any]) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    payload = {"meta": meta, "summary": summary, "requests": [asdict(r) for r in results]}
    (out_dir / "results.json").write_text(json.dumps(payload, indent=1))
    (out_dir / "report.md").write_text(markdown_report(summary, meta, drafting_notes(results),
                                                       busy_note(results, chosen_threads())))
    write_plots(out_dir, results, summary)
    return summary


def drafting_notes(results: list[RequestResult]) -> list[str]:
    """Per method, how many requests γ=auto decoded without drafting, and the engine's reason: a row
    with α 0 must say whether its drafter failed or was never asked (e.g. step costs timed on a busy
    machine made its prompt pass look unpayable)."""
    skipped: dict[str, list[str]] = {}
    totals: dict[str, int] = {}
    for result in results:
        totals[result.method] = totals.get(result.method, 0) + 1
        note = result.stats.get("speculation_note")
        if note:
            skipped.setdefault(result.method, []).append(note)
    return [f"{method}: {len(notes)} of {totals[method]} requests "
            f"{'ran without the draft model' if notes[0].startswith(DRAFT_MODEL_SITS_OUT) else 'did not draft'} — {notes[0]}"
            for method, notes in skipped.items()]


def slowed_runs(results: list[RequestResult], most: int = 0) -> tuple[int, int, int]:
    """(runs other processes slowed, runs that recorded their threads, the most threads any had — or ``most``, if
    more): a run whose fewest threads (``threads_min``, the thread governor's, specdec/threads.py) fell below that
    most lost cores to a neighbour for part of it."""
    counts = [(r.stats["threads_min"], r.stats["threads_max"]) for r in results if "threads_min" in r.stats]
    most = max(most, *(high for _, high in counts)) if counts else most
    return sum(low < most for low, _ in counts), len(counts), most


def busy_note(results: list[RequestResult], threads: int = 0) -> str:
    """A warning when other processes took cores during the runs (the thread governor gave up threads:
    ``threads_min`` below ``threads``, the count the process chose, or below the most any run had), or "" — on a
    shared machine such runs made noise look like speedups (a method at α 0 reported 1.6x) and nothing said so."""
    slowed, runs, most = slowed_runs(results, threads)
    if not slowed:
        return ""
    return (f"**Other processes took CPU cores during {slowed} of {runs} runs** (they ran on fewer than {most} "
            "threads): their timings, and speedups against them, are noisy — rerun on a quiet machine before "
            "trusting small differences.")


def repeats_text(repeats: object) -> str:
    """How each figure was taken: "median of 3 repeats", or "one run each" (not "median of 1 repeats")."""
    return "one run each" if repeats == 1 else f"median of {repeats} repeats"


def markdown_report(summary: dict, meta: dict[str, Any], notes: list[str] | None = None, busy: str = "") -> str:
    lines = [f"# specdec {meta.get('tool', 'bench')} — {meta.get('dataset')}", "",
             f"Command: `{meta.get('command', '')}`", "",
             f"Machine: {meta.get('machine', '')}; target {meta.get('model')} ({meta.get('execution')}), "
             f"{'draft ' + str(meta['draft_model']) if meta.get('draft_model') else 'no draft model'}, γ={meta.get('num_speculative_tokens')}, temperature {meta.get('temperature')}, "
             + (f"{meta['penalties']}, " if meta.get("penalties") else "")
             + f"max {meta.get('max_tokens')} tokens, {repeats_text(meta.get('repeats'))}, " + (
                 f"{meta['concurrency']} requests in flight (continuous batching): tokens/s is total throughput."
                 if meta.get("concurrency", 1) > 1 else "methods interleaved per prompt."), ""]
    mismatches = sum(m["mismatches"] for m in summary["overall"].values())
    if mismatches:
        lines += [f"**WARNING: {mismatches} greedy outputs differ from plain decoding — this is a bug.**", ""]
    if busy:
        lines += [busy, ""]
    lines += ["| category | method | tokens/s | speedup | decode speedup | α | τ | TTFT s | TPOT s | mismatches |",
              "|---|---|---|---|---|---|---|---|---|---|"]

    def cell(value: float, fmt: str, suffix: str = "") -> str:
        return f"{value:{fmt}}{suffix}" if value else "–"  # peers do not report every figure

    one_category = len(summary) == 2  # that category and "overall": the same rows twice (a traffic file's "default")
    for category, methods in summary.items():
        if one_category and category == "overall":
            continue
        for method, m in methods.items():
            reported = m.get("speculation_reported", True)  # (older results.json files lack the key)
            alpha, tau = (f"{m['acceptance_rate']:.2f}", f"{m['mean_accepted_len']:.2f}") if reported else ("–", "–")
            lines.append(f"| {category} | {method} | {m['tokens_per_s']:.2f} | {m['speedup']:.2f}× | "
                         f"{cell(m.get('decode_speedup', 0.0), '.2f', '×')} | {alpha} | {tau} | {cell(m['ttft_s'], '.3f')} | "
                         f"{cell(m['tpot_s'], '.4f')} | {m['mismatches'] if m.get('identity_checked', True) else '–'} |")
    lines += ["", "tokens/s and speedup are end to end (prefill included, as a user waits): all tokens over all wall time "
              "of the category's requests; decode speedup compares time per output token after the first (prefill "
              "excluded). α, τ, TTFT and TPOT are medians of the requests' own figures; – where not reported (a peer's), and a peer's "
              "mismatches are not checked (its kernels round differently)."]
    if notes:
        lines += ["", "Not drafting (γ=auto):", *(f"- {note}" for note in notes)]
    lines += ["", "Plots: `speedup.png` (speedup per category and method), `accepted_len.png` (accepted-length "
              "histograms), `alpha_per_position.png` (α at each draft position: where drafts go wrong), "
              "`speedup_vs_gamma.png` (when several γ were run)."]
    return "\n".join(lines) + "\n"


def write_plots(out_dir: Path, results: list[RequestResult], summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = [c for c in summary if c != "overall"] + ["overall"]
    methods = [m for m in summary["overall"] if m != "ar"]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(categories) * max(1, len(methods)) / 2), 4))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        values = [summary[c].get(method, {}).get("speedup", 0.0) for c in categories]
        ax.bar([x + i * width for x in range(len(categories))], values, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(categories))], categories, rotation=30, ha="right")
    ax.set_ylabel("speedup vs plain decoding")
    if methods:  # `--methods ar`: no bars, and matplotlib warned twice about an empty legend
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "speedup.png", dpi=100)
    plt.close(fig)

    gamma_points: dict[str, list[tuple[int, float]]] = {}
    auto_speedups: dict[str, float] = {}  # γ=auto, drawn as a dashed level beside the fixed γ it chooses among
    for method, m in summary["overall"].items():
        if "@" not in method:
            continue
        base, gamma, _ = parse_variant(method)
        label = base + (method[method.index(":tree="):] if ":tree=" in method else "")
        if gamma == "auto":
            auto_speedups[label] = m["speedup"]
        elif isinstance(gamma, int):
            gamma_points.setdefault(label, []).append((gamma, m["speedup"]))
    if any(len(points) + (label in auto_speedups) > 1 for label, points in gamma_points.items()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, points in gamma_points.items():
            points.sort()
            line, = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
            if label in auto_speedups:
                ax.axhline(auto_speedups[label], color=line.get_color(), linestyle="--", linewidth=1.0, label=f"{label} γ=auto")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("γ (draft tokens per step)")
        ax.set_ylabel("speedup vs plain decoding")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "speedup_vs_gamma.png", dpi=100)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in methods:
        hist: dict[int, int] = {}
        for r in results:
            if r.method == method:
                for k, v in (r.stats.get("accepted_len_histogram") or {}).items():
                    hist[int(k)] = hist.get(int(k), 0) + v
        if hist:
            total = sum(hist.values())
            xs = sorted(hist)
            ax.plot(xs, [hist[x] / total for x in xs], marker="o", label=method)
    ax.set_xlabel("draft tokens accepted per step")
    ax.set_ylabel("fraction of steps")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "accepted_len.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for method, alphas in alpha_per_position(results, methods).items():
        ax.plot(range(1, len(alphas) + 1), alphas, marker="o", label=method)
    ax.set_xlabel("draft position j")
    ax.set_ylabel("α_j (accepted / drafted at j)")
    ax.set_ylim(0, 1.05)
    if ax.get_legend_handles_labels()[0]:  # nothing drafted at all (e.g. the load policy said none): no lines
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "alpha_per_position.png", dpi=100)
    plt.close(fig)


def alpha_per_position(results: list[RequestResult], methods: list[str]) -> dict[str, list[float]]:
    """α at each draft position per method, over every request (counts summed, then divided, so
    a long generation weighs by its rounds)."""
    alphas: dict[str, list[float]] = {}
    for method in methods:
        drafted: list[int] = []
        accepted: list[int] = []
        for r in results:
            if r.method != method:
                continue
            for total, counts in ((drafted, r.stats.get("drafted_at_position") or []),
                                  (accepted, r.stats.get("accepted_at_position") or [])):
                total.extend([0] * (len(counts) - len(total)))
                for j, count in enumerate(counts):
                    total[j] += count
        if drafted:
            alphas[method] = [a / d if d else 0.0 for a, d in zip(accepted, drafted)]
    return alphas


#: run settings whose difference makes two runs' speeds a comparison of different work
COMPARED_SETTINGS = ("dataset", "model", "draft_model", "max_tokens", "temperature", "num_speculative_tokens", "repeats",
                     "concurrency", "machine", "execution")


def machine_description() -> str:
    """The ``machine`` of a run's meta, as bench and tune write it (compared by ``bench --compare``)."""
    import os

    import torch

    from specdec.cpu import cpu_description

    return f"{cpu_description()}, {os.cpu_count()} cores, torch {torch.__version__}"


def compare_runs(first: Path, second: Path) -> str:
    """Per category and method: tokens/s and speedup of run 2 vs run 1. Notes above the table say where
    the runs differ in what they measured (dataset, prompts, models, length, machine), which makes the
    change column a comparison of different work rather than of the code."""
    def load(path: Path) -> dict:
        file = Path(path) / "results.json"
        if not file.is_file():
            raise SpecdecError(f"no results.json in {path}")
        return json.loads(file.read_text())

    run_a, run_b = load(first), load(second)
    a, b = canonical_methods(run_a["summary"]), canonical_methods(run_b["summary"])
    meta_a, meta_b = run_a.get("meta", {}), run_b.get("meta", {})
    defaults = {"repeats": 1, "concurrency": 1}  # results written before these were recorded
    notes = [f"note: the runs differ in {key}: {meta_a.get(key, defaults.get(key))!r} vs {meta_b.get(key, defaults.get(key))!r}"
             for key in COMPARED_SETTINGS if meta_a.get(key, defaults.get(key)) != meta_b.get(key, defaults.get(key))]
    prompts_a, prompts_b = prompts_by_category(run_a), prompts_by_category(run_b)
    for category in sorted(set(prompts_a) & set(prompts_b)):
        if prompts_a[category] != prompts_b[category]:
            notes.append(f"note: {category} ran different prompts ({len(prompts_a[category])} vs {len(prompts_b[category])}, "
                         f"{len(prompts_a[category] & prompts_b[category])} in common)")
    for only, run in ((sorted(set(a) - set(b) - {"overall"}), 1), (sorted(set(b) - set(a) - {"overall"}), 2)):
        if only:
            notes.append(f"note: only run {run} has {', '.join(only)}")
    methods_a, methods_b = set(a.get("overall", {})), set(b.get("overall", {}))
    for only, run in ((sorted(methods_a - methods_b), 1), (sorted(methods_b - methods_a), 2)):
        if only:  # their rows are left out of the table (a method named ngram in one run, ngram@auto in the other)
            notes.append(f"note: only run {run} ran {', '.join(only)}: not in the table")
    lines = ["| category | method | tok/s run 1 | tok/s run 2 | change | speedup run 1 | speedup run 2 |", "|---|---|---|---|---|---|---|"]
    for category in a:
        for method, m in a[category].items():
            other = b.get(category, {}).get(method)
            if other is None:
                continue
            change = other["tokens_per_s"] / m["tokens_per_s"] - 1 if m["tokens_per_s"] else 0.0
            lines.append(f"| {category} | {method} | {m['tokens_per_s']:.2f} | {other['tokens_per_s']:.2f} | {change:+.1%} | "
                         f"{m['speedup']:.2f}× | {other['speedup']:.2f}× |")
    return "\n".join([*notes, *([""] if notes else []), *lines])


def canonical_methods(summary: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A summary with each run named by its method's registered name (``draft-suffix`` and a ``--config`` run's
    ``draft_suffix`` are one method: compared, they were two runs each missing from the other), γ and tree kept."""
    def canonical(name: str) -> str:
        method = parse_variant(name)[0]  # a prefix of the name: its γ and tree follow it
        rest = name[len(method):]
        if is_peer(method):
            return name
        try:
            return (resolve_method(method) or "ar") + rest
        except SpecdecError:  # a name this install does not know (a plugin's, an older run's "ar[int8]"): as written
            return name

    def renamed(methods: dict[str, Any]) -> dict[str, Any]:
        names = {name: canonical(name) for name in methods}
        if len(set(names.values())) < len(names):  # two runs of one method spelt two ways (an older file): as written
            return methods
        return {names[name]: metrics for name, metrics in methods.items()}

    return {category: renamed(methods) for category, methods in summary.items()}


def prompts_by_category(run: dict) -> dict[str, set[str]]:
    """The prompt ids each category of a results.json ran."""
    prompts: dict[str, set[str]] = {}
    for request in run.get("requests", []):
        prompts.setdefault(request["category"], set()).add(request["prompt_id"])
    return prompts


def penalties_description(params) -> str:  # noqa: ANN001 - SamplingParams
    """The run's penalties and min_tokens for the report header ("" when none are set)."""
    parts = [f"{name.replace('_', ' ')} {value}" for name, value, off in (
        ("repetition_penalty", params.repetition_penalty, 1.0), ("frequency_penalty", params.frequency_penalty, 0.0),
        ("presence_penalty", params.presence_penalty, 0.0), ("min_tokens", params.min_tokens, 0)) if value != off]
    return ", ".join(parts)
