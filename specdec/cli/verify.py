"""``specdec verify``: the lossless certificate. For every registered drafter (or ``--methods``):
greedy speculative output must be token-identical to plain decoding on real prompts, and on a tiny
random model the distribution of sampled tokens must equal the target's (chi-square). Exits 1 on
any FAIL; the work is :mod:`specdec.certify`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec.cli.common import add_debug_flag, add_model_args
from specdec.cli.values import number, positive_int
from specdec.errors import SpecdecError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    ver = subparsers.add_parser("verify", help="the lossless certificate: greedy identity on real prompts + distribution test",
                                description="Certify exactness for every registered drafter: (a) greedy speculative output is "
                                            "token-identical to plain decoding on real prompts with the given model pair and dtype; "
                                            "(b) on a tiny random model, the distribution of the first generated tokens under "
                                            "speculative sampling (T=0.7 with top-k; --thorough adds T=1, top-p, a regex grammar, penalties with a logit bias, "
                                            "a predicted output and seeded requests) "
                                            "equals the exact target distribution "
                                            "(chi-square test, false-alarm rate --alpha per row). Exits 1 on any FAIL.")
    # the method flags (--skip-layers, --datastore …) set the configuration the greedy check certifies on the real pair
    flags = add_model_args(ver, unused=("--method", "--draft-confidence-threshold"))
    ver.set_defaults(draft_model="qwen2.5-coder-0.5b", dtype="float32", quantize="auto")
    flags["--draft-model"].help = ("the pair's draft model, for the methods that need one (built-in name, .gguf or HF dir; "
                                   "default: qwen2.5-coder-0.5b)")
    flags["--dtype"].help = "dtype of both models with --quantize none: float32, bfloat16, float16, auto (default here: float32)"
    flags["--quantize"].help = ("the execution to certify: auto (the default: the modes `generate --draft-model` picks on this "
                                "machine, where chunked and single-token logits are bit-identical), none (--dtype), int8, "
                                "int4, int4-all")
    flags["--num-speculative-tokens"].help = "γ of every certified method (default: auto, certified as 4, as any 'auto')"
    ver.add_argument("--methods", default="all", help="comma-separated drafters to certify, or 'all' (default: all registered)")
    ver.add_argument("--thorough", action="store_true",
                     help="the long certificate: 6 prompts × 64 tokens, and every sampling configuration of the distribution test (T=1, T=0.7 with top-k, "
                          "top-p, a regex grammar, penalties with a logit bias, a predicted output, seeded requests) × 10000 samples "
                          "(the default run: 3 prompts × 32 tokens, one configuration × 1000 samples: ~3 min on 2 cores, loading included)")
    ver.add_argument("--dataset", default=None, metavar="FILE_OR_DATASET",
                     help="the greedy check's prompts: your own traffic — a JSONL with 'prompt' or 'turns' per line, or logged "
                          "chat requests ('messages', ShareGPT 'conversations'), read as bench --dataset reads them — or "
                          "spec_bench, humaneval, gsm8k (default: HumanEval and MT-Bench first turns, half each)")
    ver.add_argument("--categories", default=None, help="with --dataset: comma-separated categories (e.g. mt_bench; default: all)")
    ver.add_argument("--data-dir", default=None, help="where the named datasets live (default: ../shared/data or $SPECDEC_DATA_DIR)")
    ver.add_argument("--limit", "--prompts", dest="prompts", type=positive_int, default=None,
                     help="(--prompts is the same flag) real prompts for the greedy check: the first N (default: 3, --thorough 6)")
    ver.add_argument("--max-tokens", type=positive_int, default=None, help="tokens per prompt in the greedy check (default: 32, --thorough 64)")
    ver.add_argument("--samples", type=positive_int, default=None, help="samples per distribution test (default: 1000, --thorough 10000)")
    ver.add_argument("--alpha", type=significance, default=1e-3,
                     help="significance of each chi-square test: its false-alarm rate, in (0, 0.5] (default: 1e-3)")
    ver.add_argument("--skip-greedy", action="store_true", help="only run the distribution tests (no real models needed)")
    ver.add_argument("--skip-distribution", action="store_true", help="only run the greedy identity check")
    add_debug_flag(ver)
    ver.set_defaults(func=run)
    return ver


def significance(text: str) -> float:
    """--alpha: a chi-square test's false-alarm rate. 0 or less passes anything, 1 or more fails everything, and
    past 0.5 half the exact methods' checks would fail by chance: a certificate either way that means nothing."""
    value = number(text)
    if not 0 < value <= 0.5:
        raise argparse.ArgumentTypeError(f"must be in (0, 0.5], got {value:g}")
    return value


def verified_methods(text: str, known: list[str]) -> list[str]:
    """``--methods``: names as every command reads them (``layer-skip``, aliases such as ``draft``),
    each once, as registered."""
    from specdec.drafters.registry import resolve_method

    methods: list[str] = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        method = resolve_method(name)
        if method is None:
            raise SpecdecError(f"--methods {name}: plain decoding is what every method is checked against; "
                               f"name drafters ({', '.join(known)})")
        if method not in known:
            raise SpecdecError(f"--methods {name}: not a certified method; registered: {', '.join(known)}")
        methods += [method] if method not in methods else []
    return methods


def run(args: argparse.Namespace) -> int:
    import specdec
    from specdec import certify
    from specdec.cli.common import execution_modes, method_options
    from specdec.drafters.registry import method_info

    if args.skip_greedy and args.skip_distribution:
        raise SpecdecError("--skip-greedy with --skip-distribution leaves no check to run")
    known = certify.registered_methods()
    methods = known if args.methods == "all" else verified_methods(args.methods, known)
    prompts = args.prompts or (6 if args.thorough else 3)
    max_tokens = args.max_tokens or (64 if args.thorough else 32)
    samples = args.samples or (10_000 if args.thorough else 1000)
    configs = tuple(certify.DISTRIBUTION_CONFIGS) if args.thorough else certify.QUICK_CONFIGS
    gamma = args.num_speculative_tokens if isinstance(args.num_speculative_tokens, int) else 4
    target = draft = None
    rows = None
    data_dir = Path(args.data_dir) if args.data_dir else None
    if args.skip_greedy and (args.dataset, args.categories, args.data_dir) != (None, None, None):
        raise SpecdecError("--dataset/--categories/--data-dir choose the greedy check's prompts: not read with --skip-greedy")
    if not args.skip_greedy:  # the prompts before any model loads (a bad row: its file:line, not minutes later)
        from specdec.bench.datasets import load_prompts

        if args.dataset is None and args.categories is None:
            rows = certify.default_rows(prompts, data_dir)
        else:
            rows = load_prompts(args.dataset or "spec_bench", args.categories.split(",") if args.categories else None,
                                None, data_dir)
            from specdec.cli.generate import fitting_rows

            rows = fitting_rows(rows, args.model, max_tokens, not args.no_pull, args.dataset or "spec_bench", wanted=prompts)
        if not rows:
            raise SpecdecError(f"no prompts selected from {args.dataset or 'spec_bench'}")
    if args.config and args.method and args.methods == "all":  # certify what `specdec tune` chose, as bench runs it
        methods = [method_info(args.method).name]
    if not args.skip_greedy:
        # the draft model only where a chosen method drafts with one (ngram alone loaded the 0.5B for nothing)
        with_draft = bool(args.draft_model) and any(method_info(method).needs_draft_model for method in methods)
        # as generate picks them for the first method it can run (a draft method without a draft model cannot)
        planned = "draft_model" if with_draft else next((m for m in methods if not method_info(m).needs_draft_model), None)
        target_mode, draft_mode, _ = execution_modes(args, planned)
        print(f"loading {args.model} ({target_mode})" + (f" and {args.draft_model} ({draft_mode})" if with_draft else "")
              + " …", file=sys.stderr)
        target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=target_mode,
                                  prompt_quantize=args.prompt_quantize)
        if with_draft:
            draft = specdec.load_model(args.draft_model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True,
                                       quantize=draft_mode, prompt_quantize=args.prompt_quantize)
            from specdec.compat import check_pair

            check_pair(target, draft)  # before any check runs, not inside the first draft method's
    checks = len(methods) * ((not args.skip_greedy) + (0 if args.skip_distribution else len(configs)))
    from tqdm import tqdm

    with tqdm(total=checks, desc="verify", unit="check", file=sys.stderr) as bar:
        begun = 0

        def progress(message: str) -> None:  # called as each check begins: the previous one is done
            nonlocal begun
            bar.update(1 if begun else 0)
            begun += 1
            bar.set_postfix_str(message)

        results = certify.run_certificate(
            target, draft, methods, rows if rows is not None else prompts, max_tokens, samples, args.alpha, gamma,
            greedy=not args.skip_greedy, distribution=not args.skip_distribution, configs=configs, progress=progress,
            spec_tree=args.spec_tree, drafter_path=args.drafter_path, options=method_options(args),
            data_dir=data_dir)
        bar.update(checks - bar.n)
    print(certify.format_table(results))
    failed = [r for r in results if not r.passed]
    skipped = sum(r.skipped for r in results)
    print(f"{len(results) - len(failed) - skipped} passed, {len(failed)} failed"
          f"{f', {skipped} skipped' if skipped else ''} ({sum(r.seconds for r in results):.0f} s of checks)")
    return 1 if failed else 0
