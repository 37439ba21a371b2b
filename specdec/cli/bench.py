"""``specdec bench``: a Spec-Bench-style benchmark. Every method (and optional peers: transformers,
llama.cpp) runs on the same prompts, interleaved per prompt after a warm-up, median of ``--repeats``;
greedy outputs are checked against plain decoding; results.json, report.md and PNG plots go to
``--out``. ``--compare DIR1 DIR2`` prints the difference between two runs. The work is
:mod:`specdec.bench`."""

from __future__ import annotations

import argparse
import sys

from specdec.cli.checks import checked_methods
from specdec.cli.common import (add_debug_flag, add_model_args, add_sampling_args, check_pair_before_loading, draft_quantize,
                                execution_modes, gamma_from_args, kernels_in_use, make_output_folder, method_options,
                                pages_in_use, planned_modes, sampling_from_args)
from specdec.cli.values import gamma_list, positive_int, speculation_limit_value, tree_values
from specdec.errors import SpecdecError


#: plain decoding, what `--draft-model` runs by default (draft-suffix) and the draft model and the draft-free
#: methods alone beside it
DEFAULT_METHODS = "ar,draft-suffix,draft,ngram,suffix"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    bench = subparsers.add_parser("bench", help="Spec-Bench-style benchmark of methods (and peers) on a dataset, with report and plots",
                                  description="Run every method on the same prompts (interleaved per prompt, warm-up first, median "
                                              "of --repeats), check greedy outputs against plain decoding, and write results.json, "
                                              "report.md and PNG plots to --out. `specdec bench --compare DIR1 DIR2` prints the "
                                              "difference between two runs.")
    bench.add_argument("--dataset", default="humaneval", help="spec_bench, humaneval, gsm8k, or a JSONL file with 'prompt' or 'turns' per line (each through the chat "
                            "template unless the line says \"chat\": false, for raw completion prompts) or logged conversations "
                            "('messages' as an OpenAI chat request, ShareGPT's 'conversations': the prompt up to the last user message; "
                            "default: humaneval)")
    bench.add_argument("--data-dir", default=None, help="where the named datasets live (default: ../shared/data beside the project, or $SPECDEC_DATA_DIR)")
    bench.add_argument("--categories", default=None, help="comma-separated task groups / categories (e.g. summarization,rag,mt_bench; default: all)")
    bench.add_argument("--limit", type=positive_int, default=None, help="first N prompts per category (default: all)")
    bench.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated methods to compare: ar (plain decoding) and any name or alias "
                            "from `specdec methods`, e.g. draft, ngram, suffix, draft-suffix, retrieval, layer-skip, early-exit; "
                            f"peers as in --peers (default: {DEFAULT_METHODS})")
    bench.add_argument("--gammas", default=None, help="several γ to sweep, e.g. 2,4,6,auto (overrides --num-speculative-tokens)")
    bench.add_argument("--spec-trees", default=None, metavar="LIST",
                       help="several token trees to run for the methods that branch (draft, draft-suffix, suffix, ngram, eagle, medusa), each "
                            "its own row named method:tree=N: off = chains, auto, greedy, or a node count, e.g. off,auto "
                            "(default: --spec-tree's one value)")
    bench.add_argument("--concurrency", type=positive_int, default=1, metavar="N",
                       help="throughput mode: each method runs every prompt (first turns) with N requests in flight through "
                            "continuous batching (specdec.generate_batch); tokens/s is then the total throughput "
                            "(default: 1 = one request at a time, methods interleaved per prompt)")
    bench.add_argument("--disable-speculation-above", type=speculation_limit_value,
                       default="auto", metavar="N|auto|never",
                       help="with --concurrency: how much requests in flight may draft, as for `specdec serve`: auto "
                            "(default) γ per number of requests from the step costs measured here and the batch's α (0 "
                            "where drafting would cost throughput), N (none above N requests), never (every request "
                            "at its own γ, as if alone)")
    bench.add_argument("--repeats", type=positive_int, default=3, help="repeats per prompt and method; medians are reported (default: 3)")
    bench.add_argument("--peers", default="", help="comma-separated peers to run in the same run: hf (= transformers plain, assisted, prompt lookup; it loads "
                            "the target and draft again in float32: ~16 GB peak with the default pair), "
                            "llamacpp (= llama.cpp's llama-server plain and with the draft model; needs --llama-bin); "
                            "or name some of them in --methods: hf, hf-assisted, hf-pld, llamacpp, llamacpp-draft (default: none)")
    bench.add_argument("--llama-bin", default="/tmp/llamacpp-build/bin", metavar="DIR",
                       help="directory holding llama.cpp's llama-server, for the llamacpp peers (build: see specdec/bench/llamacpp.py)")
    bench.add_argument("--out", default="bench-out", help="output directory (default: bench-out)")
    bench.add_argument("--compare", nargs=2, metavar=("DIR1", "DIR2"), help="print the difference between two bench runs and exit")
    flags = add_model_args(bench, unused={"--method": "name the methods to run in --methods"})
    add_sampling_args(bench)
    bench.set_defaults(draft_model="qwen2.5-coder-0.5b")
    flags["--draft-model"].help = ("draft model of the methods that run one (draft, draft-suffix, hf-assisted, llamacpp-draft), "
                                   "loaded only if one of them runs (default: qwen2.5-coder-0.5b)")
    flags["--num-speculative-tokens"].help = "γ of every method, or 'auto' (default: auto); --gammas sweeps several"
    add_debug_flag(bench)
    bench.set_defaults(func=run)
    return bench


def target_modes(args: argparse.Namespace, methods: list[str]) -> tuple[str, dict[str, str]]:
    """(the target's mode for plain decoding, each speculative method's mode) as ``specdec generate`` (or, with
    ``--concurrency N``, ``specdec serve --max-num-seqs N``) runs them: with ``--quantize auto`` on the CPU each
    method gets the mode measured fastest here for it (the int8 target verifies more tokens per step where int4
    decodes one faster; a single target made bench report a slower speculation than generate ran); otherwise
    every method runs ``--quantize``'s mode."""
    from specdec.api import resolve_device
    from specdec.drafters.registry import resolve_method

    if args.quantize != "auto" or resolve_device(args.device) != "cpu":
        return args.quantize, {}
    modes = {method: planned_modes(args, resolve_method(method), args.concurrency)[0] for method in methods}
    return planned_modes(args, None, args.concurrency)[0], modes


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specdec.bench.report import compare_runs

    if args.compare:
        ignored = sorted(dest for dest in getattr(args, "typed_flags", ()) if dest not in ("compare", "debug", "command"))
        if ignored:  # `bench --compare A B --limit 3` compared the two runs as they are, without a word
            flags = ", ".join("--" + dest.replace("_", "-") for dest in ignored)
            print(f"warning: {flags} not read with --compare: it compares two finished runs", file=sys.stderr)
        print(compare_runs(Path(args.compare[0]), Path(args.compare[1])))
        return 0
    import specdec
    from specdec.bench.datasets import load_prompts, sampled_rows
    from specdec.bench.report import machine_description, penalties_description, write_results
    from specdec.bench.runner import PEER_METHODS, BenchConfig, is_peer, method_needs_draft, run_benchmark, run_concurrent
    from specdec.drafters.registry import is_plain

    rows = load_prompts(args.dataset, args.categories.split(",") if args.categories else None, args.limit,
                        Path(args.data_dir) if args.data_dir else None)
    if not rows:
        raise SpecdecError(f"no prompts selected from {args.dataset}")
    sampled = sampled_rows(rows)
    if sampled and "temperature" not in getattr(args, "typed_flags", set()) and not args.temperature:
        print(f"note: {sampled} of the {len(rows)} logged requests sampled (temperature > 0); bench runs them greedily, "
              "where acceptance is higher: add --temperature T to measure them as they were served", file=sys.stderr)
    methods = ["ar" if m.strip() == "plain" else m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:  # was a plain-decoding-only bench, exit 0 (tune refuses the same)
        raise SpecdecError(f"--methods {args.methods!r}: names no method (e.g. --methods ar,draft-suffix)")
    if args.config and args.method and args.methods == DEFAULT_METHODS:  # bench what `specdec tune` chose
        methods = ["ar", args.method]
    if not args.draft_model and args.methods == DEFAULT_METHODS:  # no draft model (a tune.json's null): the rest
        left = [m for m in methods if method_needs_draft(m)]
        methods = [m for m in methods if not method_needs_draft(m)]
        if left:
            print(f"note: no draft model: {', '.join(left)} left out of the default methods", file=sys.stderr)
    checked_methods(args, [m for m in methods if not is_peer(m)], "--methods")  # before any model loads
    from specdec.cli.generate import fitting_rows

    rows = fitting_rows(rows, args.model, args.max_tokens, not args.no_pull, args.dataset)
    if not rows:
        raise SpecdecError(f"no prompts of {args.dataset} fit the model's context with --max-tokens {args.max_tokens}")
    typed = getattr(args, "typed_flags", set())
    if "disable_speculation_above" in typed and args.concurrency == 1:
        print("warning: --disable-speculation-above is not read without --concurrency (one request at a time)", file=sys.stderr)
    peers_wanted = [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in peers_wanted:
        if peer not in PEER_METHODS:
            raise SpecdecError(f"unknown peer {peer!r}; available: {', '.join(PEER_METHODS)}")
        methods += PEER_METHODS[peer]
    if "llama_bin" in typed and not any(m in PEER_METHODS["llamacpp"] for m in methods):
        print("warning: --llama-bin is read only by the llama.cpp peers: add --peers llamacpp (or llamacpp, "
              "llamacpp-draft in --methods)", file=sys.stderr)
    drafting = [m for m in methods if method_needs_draft(m)]  # the peers' too (hf-assisted, llamacpp-draft)
    if drafting and not args.draft_model:  # a --config file's "draft_model": null, or --draft-model ''
        raise SpecdecError(f"{', '.join(drafting)}: need a draft model: give --draft-model NAME_OR_PATH"
                           + (f" (--config {args.config} chose none)" if args.config else ""))
    gammas = gamma_list(args.gammas) if args.gammas else [gamma_from_args(args)]
    spec_trees = tree_values(args.spec_trees) if args.spec_trees else [args.spec_tree]
    params = sampling_from_args(args)
    if drafting:  # (after the flags' own checks)
        check_pair_before_loading(args, "draft_model")
    plain_mode, method_modes = target_modes(args, [m for m in methods if not is_peer(m) and not is_plain(m)])
    if args.quantize not in ("auto", "none"):  # a tune.json pins its mode: tune's "Chosen" line was against auto's
        where = "--config" if args.config and "quantize" not in typed else "--quantize"
        print(f"note: ar (plain decoding) runs in {args.quantize}, as {where} pins it: speedups are against plain "
              f"decoding in that mode, which may not be the fastest plain decoding here (--quantize auto measures "
              f"against that one, as tune's chosen line does)", file=sys.stderr)
    make_output_folder(args.out, "--out")  # after the inputs' checks (each left an empty folder), before any model loads
    target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=plain_mode,
                                prompt_quantize=args.prompt_quantize)
    copies = {mode: specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True,
                                       quantize=mode, prompt_quantize=args.prompt_quantize)
              for mode in dict.fromkeys(method_modes.values()) if mode != plain_mode}
    method_targets = {method: copies[mode] for method, mode in method_modes.items() if mode != plain_mode}
    draft = None
    if drafting:
        # the draft's mode as generate picks it for speculation (int4-all, timed with its reduced head),
        # not the mode plain decoding of the draft model would pick
        _, draft_mode, _ = execution_modes(args, "draft_model") if draft_quantize(args) == "auto" else (None, draft_quantize(args), None)
        draft = specdec.load_model(args.draft_model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True,
                                   quantize=draft_mode, prompt_quantize=args.prompt_quantize)
    if draft is not None:
        from specdec.compat import check_pair

        check_pair(target, draft)
    peer_methods = [m for m in methods if any(m in names for names in PEER_METHODS.values())]
    if peer_methods and params.has_penalties:  # HF lacks OpenAI's penalties; llama.cpp's read a window of recent tokens
        raise SpecdecError(f"--repetition-penalty / --frequency-penalty / --presence-penalty / --min-tokens: the peers "
                           f"({', '.join(peer_methods)}) define them differently or not at all, so their text would differ; "
                           "bench them without")
    if peer_methods and params.stop_token_ids:  # the peers stop on their own end-of-sequence ids only
        raise SpecdecError(f"--stop-token-id: the peers ({', '.join(peer_methods)}) do not read it, so their text would "
                           "run on past it; bench them without")
    peers: dict = {}
    close_peers = None
    peer_gamma = gammas[0] if isinstance(gammas[0], int) else 4
    if any(m in PEER_METHODS["hf"] for m in methods):  # peers may also be named one by one in --methods
        from specdec.bench.peers import hf_peers

        peers.update(hf_peers(target, draft, params, num_tokens=peer_gamma))
    if any(m in PEER_METHODS["llamacpp"] for m in methods):
        from specdec.bench.llamacpp import llamacpp_peers

        wants_draft = "llamacpp-draft" in methods
        llama, close_peers = llamacpp_peers(args.llama_bin, target.path, draft.path if wants_draft and draft else None,
                                            params, peer_gamma, detokenize=target.tokenizer.decode)
        peers.update(llama)
    config = BenchConfig(methods=methods, params=params, gammas=gammas, repeats=args.repeats, options=method_options(args),
                         spec_trees=spec_trees, disable_speculation_above=args.disable_speculation_above)
    try:
        if args.concurrency > 1:
            results = run_concurrent(target, draft, rows, config, args.concurrency, method_targets=method_targets)
        else:
            results = run_benchmark(target, draft, rows, config, peers=peers, method_targets=method_targets)
    finally:
        if close_peers is not None:
            close_peers()
    # which instruction sets ran, and on which pages
    execution = (target.backend.dtype_name
                 + "".join(f"; {', '.join(m for m in method_targets if method_targets[m] is copy)} on the target in {mode} "
                           f"(--quantize auto's choice for speculation here; plain decoding in {mode}: row ar[{mode}])"
                           for mode, copy in copies.items())
                 + kernels_in_use(target, *copies.values(), draft) + pages_in_use(target, *copies.values(), draft))
    meta = {"dataset": args.dataset, "command": "specdec " + " ".join(sys.argv[1:]),
            "machine": machine_description(), "model": args.model,
            "draft_model": args.draft_model if draft else None, "execution": execution,
            "num_speculative_tokens": ",".join(map(str, gammas)), "temperature": args.temperature,
            "max_tokens": args.max_tokens, "repeats": args.repeats, "concurrency": args.concurrency,
            "penalties": penalties_description(params)}
    summary = write_results(Path(args.out), results, meta)
    print((Path(args.out) / "report.md").read_text())
    bad = sum(m["mismatches"] for m in summary["overall"].values())
    if bad:
        print(f"error: {bad} greedy outputs differ from plain decoding (see {args.out}/results.json)", file=sys.stderr)
        return 3
    return 0
