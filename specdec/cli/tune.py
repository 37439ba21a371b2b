"""``specdec tune``: measure every applicable drafter and γ on the user's prompts on this machine, pick
the fastest exact configuration, and write it as a file ``generate`` / ``serve`` / ``bench`` read with
``--config`` (and, with ``--export``, as vLLM / SGLang / llama.cpp flags). See :mod:`specdec.tune`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from specdec.cli.checks import checked_methods
from specdec.cli.common import (add_debug_flag, add_model_args, check_pair_before_loading, draft_quantize, kernels_in_use,
                                method_options, pages_in_use)
from specdec.cli.values import gamma_list, non_negative_int, positive_int, positive_number, tree_values
from specdec.config import DEFAULT_SPEC_TREE, SpecConfig

#: token trees tune tries for the methods that branch: chains, and trees sized by the cost model. Tune
#: measures greedy requests, where "greedy" trees are "auto" ones; saving "greedy" keeps a tuned
#: configuration's later sampled requests on chains (their trees measured break-even on CPU)
DEFAULT_SPEC_TREES = ("off", DEFAULT_SPEC_TREE)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    tune = subparsers.add_parser(
        "tune", help="find the fastest exact drafter and γ for your prompts on this machine; write a --config file",
        description="Run plain decoding and every applicable speculative method (each γ in --gammas) on your prompts, "
                    "interleaved per prompt, greedy; pick the configuration with the best end-to-end speedup (plain "
                    "decoding if none beats it by 3%); write OUT/tune.json (read by generate/serve/bench --config), "
                    "OUT/report.md and plots. Resumable: a second run with the same OUT reuses finished prompts (of both passes).")
    tune.add_argument("--dataset", "--prompts", dest="prompts", default="humaneval", metavar="FILE_OR_DATASET",
                      help="(--prompts, its first name, is the same flag; in verify and calibrate-skip --prompts is a count) a JSONL file with 'prompt' or 'turns' per line (each through the chat template unless the line says "
                           "\"chat\": false, for raw completion prompts as HumanEval's) or logged conversations ('messages' as an "
                           "OpenAI chat request, ShareGPT's 'conversations': system prompt and history kept, a logged answer dropped), "
                           "or humaneval, gsm8k, spec_bench (default: humaneval)")
    tune.add_argument("--categories", default=None, help="spec_bench task groups / categories, comma-separated (default: all)")
    tune.add_argument("--limit", type=positive_int, default=8, help="prompts per category (default: 8)")
    tune.add_argument("--data-dir", default=None, help="where the named datasets live (default: ../shared/data or $SPECDEC_DATA_DIR)")
    tune.add_argument("--methods", default=None,
                      help="methods to try, comma-separated (default: ngram, suffix, and draft_model, draft_suffix with "
                           "--draft-model, retrieval with --datastore)")
    tune.add_argument("--gammas", default="auto", help="γ values to try per method, e.g. auto,3,5 (default: auto)")
    tune.add_argument("--spec-trees", default=",".join(DEFAULT_SPEC_TREES), metavar="LIST",
                      help="token trees to try for the methods that branch (draft_model, draft_suffix, suffix, ngram): "
                           "off = chains, greedy (trees for greedy requests only), auto, or a node count N, e.g. off,greedy,8 "
                           f"(default: {','.join(DEFAULT_SPEC_TREES)})")
    tune.add_argument("--max-tokens", type=positive_int, default=128, help="tokens generated per prompt at most (default: 128)")
    tune.add_argument("--ignore-eos", action="store_true",
                      help="generate --max-tokens on every prompt, past the end of the answer (default: stop at the end of "
                           "the answer, as a server does: the text after it is not your traffic's, and drafters do well or "
                           "badly on it for its own reasons)")
    tune.add_argument("--budget-minutes", type=positive_number, default=10.0,
                      help="stop starting new prompts after this long (at least 2 are measured; loading the models and, "
                           "once per machine, timing their step costs come on top; default: 10)")
    tune.add_argument("--out", type=Path, default=Path("tune-out"), help="output folder (default: tune-out)")
    tune.add_argument("--html-prompts", type=non_negative_int, default=2, metavar="N",
                      help="write the acceptance view (tokens colored accepted / correction / bonus) of the chosen "
                           "configuration on the first N prompts to OUT/acceptance/ (0: none; default: 2)")
    tune.add_argument("--export", action="append", default=[], choices=("vllm", "sglang", "llamacpp"),
                      help="also write the chosen configuration for this engine to OUT/ENGINE.sh (repeatable)")
    flags = add_model_args(tune, unused={"--num-speculative-tokens": "tune measures the γ values in --gammas",
                                         "--method": "name the methods to measure in --methods",
                                         "--spec-tree": "tune measures the trees in --spec-trees"})
    flags["--draft-model"].help = ("draft model of the methods that run one (draft_model, draft_suffix: measured when it is "
                                   "given; built-in name, .gguf or HF dir)")
    add_debug_flag(tune)
    tune.set_defaults(func=run)
    return tune


def run(args: argparse.Namespace) -> int:
    import specdec
    from specdec.api import plan_execution
    from specdec.bench.datasets import load_prompts, sampled_rows
    from specdec.bench.report import machine_description, write_results
    from specdec.bench.runner import BenchConfig
    from specdec.cpu import cpu_description
    from specdec.errors import SpecdecError
    from specdec.sampling import SamplingParams
    from specdec.tune import (FIRST_PASS_SHARE, candidate_methods, choose, config_file, distinct_trees, run_tune,
                              settle_against_plain)

    rows = load_prompts(args.prompts, args.categories.split(",") if args.categories else None, args.limit,
                        Path(args.data_dir) if args.data_dir else None)
    if len(rows) < 2:
        raise SpecdecError(f"tune needs at least 2 prompts; {args.prompts} gave {len(rows)}")
    methods = (checked_methods(args, [m.strip() for m in args.methods.split(",") if m.strip()], "--methods") if args.methods
               else candidate_methods(args.draft_model is not None, args.datastore is not None))
    if not methods:
        raise SpecdecError(f"--methods {args.methods}: names no speculative method (plain decoding is always measured)")
    gammas = gamma_list(args.gammas)
    trees = tree_values(args.spec_trees)
    from specdec.cli.generate import fitting_rows

    rows = fitting_rows(rows, args.model, args.max_tokens, not args.no_pull, args.prompts)  # (after the flags' checks)
    if len(rows) < 2:
        raise SpecdecError(f"tune needs at least 2 prompts that fit the context; {args.prompts} has {len(rows)}")
    sampled = sampled_rows(rows)
    if sampled:  # a logged request's temperature: tune's answer is the greedy one's
        print(f"note: {sampled} of the {len(rows)} logged requests sampled (temperature > 0); tune measures greedy "
              "decoding, where acceptance is higher than under sampling: check the chosen configuration with `specdec "
              "bench --temperature T` on them", file=sys.stderr)
    check_pair_before_loading(args, "draft_model" if args.draft_model else None)
    target_mode, draft_mode = args.quantize, draft_quantize(args)
    plan = None
    if args.quantize == "auto" and args.device in ("auto", "cpu"):  # the modes measured fastest here
        plan = plan_execution(args.model, args.draft_model, "draft_model" if args.draft_model else "ngram",
                              auto_pull=not args.no_pull, draft_vocab_size=args.draft_vocab_size or None)
        target_mode, draft_mode = plan.target_mode, plan.draft_mode or draft_mode
    target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull, quantize=target_mode,
                                  prompt_quantize=args.prompt_quantize)
    draft = None
    if args.draft_model:
        draft = specdec.load_model(args.draft_model, args.dtype, args.device, auto_pull=not args.no_pull, quantize=draft_mode,
                                      prompt_quantize=args.prompt_quantize)
    # stop where the answer ends (a walkthrough: 3 of 6 logged chats ended at 29-35 of 48 tokens, and tune timed
    # "<|im_end|><|endoftext|>Human: …" after it — draft_suffix's τ there 3.4 against 7.5 on the real answer)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos)
    trees, same = distinct_trees(trees, gammas, target.backend.step_seconds)
    for left_out, kept in same:
        print(f"note: --spec-trees {left_out} verifies what {kept} does on this target ({target.backend.dtype_name}; greedy "
              f"trees grow only where its verify curve is flat): measured once, as {kept}", file=sys.stderr)
    config = BenchConfig(methods=methods, params=params, gammas=gammas, repeats=1, options=method_options(args),
                         spec_trees=trees)
    setup = {"model": args.model, "draft_model": args.draft_model, "execution": [target.backend.dtype_name,
             draft.backend.dtype_name if draft else None], "methods": methods, "gammas": gammas, "trees": trees,
             "max_tokens": args.max_tokens, "cpu": cpu_description(), "ignore_eos": args.ignore_eos}
    templated = sum(row.chat for row in rows)
    chat_note = ("" if templated == 0 else " (through the chat template)" if templated == len(rows)
                 else f" ({templated} through the chat template)")
    print(f"tune: {len(rows)} prompts{chat_note} × (plain + {len(methods)} method{'s' if len(methods) != 1 else ''} × {len(gammas)} γ"
          f"{f' × {len(trees)} tree settings' if len(trees) > 1 else ''}), {args.max_tokens} tokens each, "
          f"budget {args.budget_minutes:g} min; target {target.backend.dtype_name}"
          f"{f', draft {draft.backend.mode}' if draft else ''}; CPU {cpu_description()}", file=sys.stderr)
    from tqdm import tqdm

    from specdec.tune import MeasurementStore

    changed = MeasurementStore(args.out, setup).setup_change()
    if changed:
        print(f"note: {args.out / 'measurements.jsonl'} holds prompts measured under other settings ({changed}): "
              "measuring again", file=sys.stderr)
    start = time.perf_counter()
    with tqdm(total=len(rows), desc="tune", unit="prompt") as bar:
        first_pass_s = args.budget_minutes * 60 * (FIRST_PASS_SHARE if plan is not None and plan.choice is not None else 1.0)
        results, left_out, reused = run_tune(target, draft, rows, config, args.out, first_pass_s, setup,
                                             on_row=lambda _: bar.update(1))
    if reused:
        print(f"tune: {reused} prompt(s) reused from {args.out / 'measurements.jsonl'} (the same prompt, models, modes, "
              "methods, γ and tokens were measured there before)", file=sys.stderr)
    method, gamma, tree, figures = choose(results)
    modes, measured_execution, mode_note = None, target.backend.dtype_name, ""
    if plan is not None:
        modes, target = _check_modes(args, plan, target, draft, rows, results, method, gamma or gammas[0], tree,
                                     len(gammas) > 1, params, start, setup)
        target_mode = modes["chosen"]
    meta = {"tool": "tune", "dataset": args.prompts, "command": "specdec " + " ".join(sys.argv[1:]), "machine": machine_description(),
            "model": args.model, "draft_model": args.draft_model,
            "execution": measured_execution + kernels_in_use(target, draft) + pages_in_use(target, draft),  # as bench writes it
            "num_speculative_tokens": ",".join(map(str, gammas)), "temperature": 0.0, "max_tokens": args.max_tokens,
            "repeats": 1}
    summary = write_results(args.out, results, meta)
    if modes is not None:  # against the plain decoding a user gets (specdec.tune.settle_against_plain)
        method, gamma, tree, target_mode, figures, mode_note = settle_against_plain(modes, method, gamma, tree, target_mode,
                                                                                   figures)
    defaults = {f.name: f.default for f in dataclasses.fields(SpecConfig)}
    settings = {"model": args.model, "draft_model": args.draft_model, "quantize": target_mode,
                "draft_quantize": draft_mode, "draft_vocab_size": args.draft_vocab_size,
                # the method flags given (--drafter-path, --skip-layers …): --config FILE runs what was measured
                **{key: value for key, value in method_options(args).items() if value != defaults.get(key)}}
    measured = {"prompts": len({r.prompt_id for r in results}), "left_out_for_budget": left_out,
                "seconds": round(time.perf_counter() - start, 1), "cpu": cpu_description(), "dataset": args.prompts}
    chosen = config_file(method, gamma, gammas[0], settings, figures, summary, measured, tree)
    if modes is not None:
        chosen["measured"]["execution_modes"] = modes
    if modes is not None and len(modes["measured_tok_s"]) > 1:  # the second pass's figures: in the report too
        with open(args.out / "report.md", "a") as report:
            report.write(modes_section(modes))
    if args.html_prompts > 0:
        _acceptance_views(args, target, draft, rows[:min(args.html_prompts, measured["prompts"])], chosen["settings"], params)
    (args.out / "tune.json").write_text(json.dumps(chosen, indent=1))
    verdict = (f"plain decoding (no method beat it by 3% here{mode_note})" if method is None else
               f"--method {method} --num-speculative-tokens {chosen['settings']['num_speculative_tokens']}"
               f"{'' if tree == DEFAULT_SPEC_TREE else f' --spec-tree {tree}'}: "
               f"{figures['speedup']:.2f}× plain end to end, α {figures['acceptance_rate']:.2f}{mode_note}")
    with open(args.out / "report.md", "a") as report:  # what was chosen was only on stdout and in tune.json
        # views only of a speculative choice: plain decoding has no accepted tokens to show
        report.write(chosen_section(verdict, target_mode, args.html_prompts > 0 and method is not None))
    print((args.out / "report.md").read_text())
    print(f"chosen: {verdict}\nwrote {args.out / 'tune.json'} (use: specdec generate|serve|bench --config {args.out / 'tune.json'})")
    if left_out:
        print(f"note: {left_out} prompts left out for the budget (--budget-minutes)", file=sys.stderr)
    for engine in args.export:
        _export(engine, args, chosen["settings"])
    return 0


def _check_modes(args: argparse.Namespace, plan, target, draft, rows, results, method, gamma, tree, several_gammas: bool,  # noqa: ANN001
                 params, start: float, setup: dict):  # noqa: ANN001, ANN202
    """Expected tokens/s per target mode with the measured α (:func:`specdec.tune.mode_rates`); when
    another mode is expected faster — or the choice speculates (:func:`specdec.tune.mode_to_measure`) —
    measure the chosen configuration there too, on the same prompts, and keep whichever measured
    faster. Returns (a record for tune.json, the target to use). Its runs are stored beside the first pass's
    (:class:`specdec.tune.MeasurementStore`, under a setup naming both modes and the configuration), so a
    resumed tune re-measures only prompts not measured — or slowed — before."""
    from tqdm import tqdm

    import specdec
    from specdec.bench.runner import BenchConfig, run_benchmark, summarize, variant_name
    from specdec.tune import MIN_SPEEDUP, MeasurementStore, mode_rates, mode_to_measure

    overall = summarize(results)["overall"]
    name = "ar" if method is None else variant_name(method, gamma, tree, several_gammas)
    measured_mode = target.backend.dtype_name
    forwards_per_token = overall[name].get("draft_forwards_per_token", 1.0)
    rates = mode_rates(plan, method, overall[name]["acceptance_rate"], forwards_per_token)
    record = {"measured_in": measured_mode, "expected_tok_s": {m: round(r, 2) for m, r in (rates.rates if rates else {}).items()},
              "measured_tok_s": {measured_mode: round(overall[name]["tokens_per_s"], 2)}, "chosen": measured_mode}
    if method is not None and "draft_forwards_per_token" in overall[name]:
        record["draft_forwards_per_token"] = round(forwards_per_token, 3)
    other = mode_to_measure(rates, measured_mode, method)
    if other is None:
        return record, target
    if time.perf_counter() - start > args.budget_minutes * 60:
        record["note"] = f"{other} was not measured: the budget was spent first"
        return record, target
    print(f"tune: measuring the chosen configuration with the target in {other} on the same prompts (expected "
          f"{rates.rates[other] / rates.rates[measured_mode]:.2f}× {measured_mode} with the measured α)", file=sys.stderr)
    measured_ids = {r.prompt_id for r in results}
    config = BenchConfig(methods=["ar" if method is None else method], params=params, gammas=[gamma], repeats=1,
                         options=method_options(args), spec_trees=[tree])
    second = {**setup, "pass": "modes", "method": method, "gamma": gamma, "tree": tree}
    stores = {mode: MeasurementStore(args.out, {**second, "mode": mode}) for mode in (other, measured_mode)}
    most = max(store.most_threads() for store in stores.values())
    other_target = None

    def load_other():  # noqa: ANN202 - a LoadedModel, loaded once and only when a prompt is measured or it is chosen
        nonlocal other_target
        if other_target is None:
            other_target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull,
                                              quantize=other, prompt_quantize=args.prompt_quantize)
        return other_target

    # both modes again, interleaved per prompt: the first pass's figures are from another time window, and on a
    # shared machine the load moves between them (a 2.83x headline that a bench minutes later put at 1.2x)
    by_mode: dict[str, list] = {other: [], measured_mode: []}
    reused, warmed = 0, False
    for row in tqdm([row for row in rows if row.id in measured_ids], desc=f"tune {other}", unit="prompt"):
        stored = {mode: store.reusable(row, most) for mode, store in stores.items()}
        if all(runs is not None for runs in stored.values()):
            reused += 1
        else:
            for mode, model in ((other, load_other()), (measured_mode, target)):
                stored[mode] = run_benchmark(model, draft, [row], config, progress=False, warm_up=not warmed)
                stores[mode].add(row, stored[mode])
            warmed = True
        for mode in by_mode:
            by_mode[mode] += stored[mode]
    if reused:
        print(f"tune: {reused} prompt(s) of the {other} pass reused from {args.out / 'measurements.jsonl'}", file=sys.stderr)
    other_results, same_results = by_mode[other], by_mode[measured_mode]
    chosen_name = "ar" if method is None else variant_name(method, gamma, tree, False)
    there, again = summarize(other_results)["overall"], summarize(same_results)["overall"]
    figures = there[chosen_name]
    record["measured_tok_s"] = {measured_mode: round(again[chosen_name]["tokens_per_s"], 2), other: round(figures["tokens_per_s"], 2)}
    # the baseline is the plain decoding a user gets (auto's plain mode, int4 where its single step is cheaper): the
    # measured mode's plain run made int8 speculation 1.71x "plain" where int4 plain put it at ~1.27x (a walkthrough)
    plain_by_mode = {measured_mode: again["ar"]["tokens_per_s"], other: there["ar"]["tokens_per_s"]}
    record["plain_mode"] = plan.plain_mode if plan.plain_mode in plain_by_mode else measured_mode
    record["plain_tok_s"] = round(plain_by_mode[record["plain_mode"]], 2)
    record["plain_tok_s_by_mode"] = {mode: round(tok_s, 2) for mode, tok_s in plain_by_mode.items()}
    if not figures["mismatches"] and figures["tokens_per_s"] >= MIN_SPEEDUP * again[chosen_name]["tokens_per_s"]:
        record["chosen"] = other
        return record, load_other()  # (every prompt reused: loaded now, the chosen mode's model is still needed)
    return record, target


def chosen_section(verdict: str, target_mode: str, views: bool) -> str:
    """report.md's last section: the configuration ``tune.json`` holds, and the rule that chose it."""
    mode = "" if f"target in {target_mode}" in verdict else f" (target in {target_mode})"  # the verdict may name it
    return ("\n## Chosen\n\n" + f"{verdict}{mode}.\n\n"
            "The fastest configuration whose greedy outputs were all identical to plain decoding's, end to end (prompt "
            "passes included), if it beats plain decoding by at least 3 %; plain decoding otherwise. Runs are timed once "
            "each: differences of a few percent between methods are within these machines' noise."
            + (" The chosen configuration's acceptance views (every token colored accepted / correction / bonus) are in "
               "acceptance/." if views else "") + "\n")


def modes_section(modes: dict) -> str:
    """report.md's account of the target-mode check: the chosen configuration timed in each target mode
    and the measured mode's plain decoding, interleaved per prompt in one pass (tune.json's
    measured.execution_modes)."""
    lines = ["", "## Target execution modes", "",
             "The chosen configuration timed again in each target mode, interleaved per prompt with plain decoding "
             f"in each (tokens/s, end to end; × plain: against plain decoding in {modes.get('plain_mode', modes['measured_in'])}, "
             "the mode `--quantize auto` decodes plainly in). Expected figures come from step costs timed on two random "
             "layers with the measured α: they rank the modes, they do not predict end-to-end speed.", "",
             "| target mode | expected decode tok/s (ranks the modes) | measured tok/s, end to end | × plain |", "|---|---|---|---|"]
    plain = modes.get("plain_tok_s") or 0.0
    for mode, tok_s in modes["measured_tok_s"].items():
        expected = modes["expected_tok_s"].get(mode)
        chosen = mode == modes["chosen"] and not modes.get("plain_chosen")
        lines.append(f"| {mode}{' (chosen)' if chosen else ''} | "
                     f"{'–' if expected is None else f'{expected:.1f}'} | {tok_s:.1f} | "
                     f"{f'{tok_s / plain:.2f}×' if plain else '–'} |")
    by_mode = modes.get("plain_tok_s_by_mode", {modes["measured_in"]: plain})
    lines.append("\nplain decoding: " + ", ".join(f"{tok_s:.1f} tok/s in {mode}" for mode, tok_s in by_mode.items()) + " (same pass)\n")
    return "\n".join(lines)


def _acceptance_views(args: argparse.Namespace, target, draft, rows, settings: dict, params) -> None:  # noqa: ANN001
    """The chosen configuration's acceptance view on the first prompts (``--html-prompts``)."""
    import specdec
    from specdec.api import encode_prompt
    from specdec.cli.generate import write_view

    if settings["method"] is None:
        if "html_prompts" in getattr(args, "typed_flags", set()):
            print("note: no acceptance views (--html-prompts): plain decoding was chosen, nothing was drafted", file=sys.stderr)
        return
    folder = args.out / "acceptance"
    folder.mkdir(parents=True, exist_ok=True)
    spec = SpecConfig(method=settings["method"], num_speculative_tokens=settings["num_speculative_tokens"],
                      **method_options(args))
    for row in rows:
        ids = encode_prompt(target, row.first_prompt(), chat=row.chat)
        out = specdec.generate(target, ids, params, draft=draft if settings["draft_model"] else None, spec=spec)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in row.id)
        write_view(str(folder / f"{safe}.html"), target, row.first_prompt(), row.chat, out.token_ids, out.stats)


def _export(engine: str, args: argparse.Namespace, settings: dict) -> None:
    from specdec.exports import export

    if settings["method"] is None:
        print(f"not writing {engine}.sh: plain decoding was chosen", file=sys.stderr)
        return
    spec = SpecConfig(method=settings["method"], num_speculative_tokens=settings["num_speculative_tokens"])
    path = args.out / f"{engine}.sh"
    path.write_text(export(engine, args.model, spec, settings["draft_model"]).render())
    print(f"wrote {path}")
