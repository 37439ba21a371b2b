"""``specdec serve``: an OpenAI-compatible HTTP server (completions and chat, SSE streaming,
/v1/models, /health, Prometheus /metrics) that decodes speculatively. The flags set the server's
default method and γ; a request may override them with a ``speculative`` field. Models load on the
thread that will run them (:class:`specdec.server.executor.ModelExecutor`); the app is
:mod:`specdec.server.app`."""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from specdec.cli.common import add_debug_flag, add_model_args, execution_modes, spec_from_args
from specdec.cli.values import (bounded_int, count_or_word, default_max_tokens, non_negative_int, positive_int,
                                speculation_limit_value, stats_interval, string_list)
from specdec.cli.startup_line import replica_settings, startup_line
from specdec.config import DEFAULT_BLOCK_SIZE, DEFAULT_PREFIX_CACHE_GB, DEFAULT_SUFFIX_CACHE_ENTRIES
from specdec.errors import SpecdecError
from specdec.server.security import API_KEY_ENV, DEFAULT_MAX_BODY_BYTES
from specdec.server.stats_log import DEFAULT_INTERVAL_S as DEFAULT_STATS_INTERVAL_S

if TYPE_CHECKING:
    from specdec.server.state import ServerState

#: --max-log-len's default: characters of each prompt the request log shows
DEFAULT_MAX_LOG_LEN = 500


def host_name(text: str) -> str:
    """--host: an address; an empty one bound every interface (uvicorn's reading), not the default 127.0.0.1."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty host binds every interface: give 127.0.0.1, or 0.0.0.0 on purpose")
    return text.strip()


def port_number(text: str) -> int:
    """--port: 0..65535, 0 a free one (uvicorn's bind raised OverflowError with a traceback after the models had
    loaded)."""
    return bounded_int(text, 0, "a port number", most=65535)


def prefill_chunk_value(text: str) -> int | str:
    """``--prefill-chunk``: ``auto`` or a number of tokens (0 = whole prompts)."""
    return count_or_word(text, ("auto",), 0, "tokens")


def batched_tokens_value(text: str) -> int | str:
    """``--max-num-batched-tokens``: ``auto`` or a number of tokens (at least 1)."""
    return count_or_word(text, ("auto",), 1, "tokens")


def partial_prefills_value(text: str) -> int | str:
    """``--max-num-partial-prefills``: ``auto`` or a number of prompts (at least 1)."""
    return count_or_word(text, ("auto",), 1, "prompts")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    serve = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server with speculative decoding",
                                  description="Serve /v1/completions and /v1/chat/completions (streaming with SSE), /v1/models, "
                                              "/health and /metrics (Prometheus). Every response carries its speculative stats in "
                                              "usage.speculative; requests may override the method or γ with a 'speculative' field "
                                              "(or disable it with \"speculative\": null).")
    flags = add_model_args(serve)
    flags["--quantize"].help += (". A server's auto is the mode with the most total tokens/s at --max-num-seqs concurrent "
                                 "requests (prefill included), which can differ from the fastest for one request (the "
                                 "choice and its expected rates are printed at start); name a mode to pin it")
    flags["--num-speculative-tokens"].help += (". Requests sharing forwards draft at most what --disable-speculation-above's "
                                               "γ table prices at the current load (with a fixed limit: γ=auto's only)")
    serve.add_argument("--host", type=host_name, default="127.0.0.1",
                       help="address to bind (default: 127.0.0.1; 0.0.0.0 for every interface — then set an API key)")
    serve.add_argument("--port", type=port_number, default=8000, help="port (default: 8000; 0 picks a free one)")
    serve.add_argument("--max-concurrency", "--max-num-seqs", dest="max_concurrency", type=positive_int, default=8,
                       help="requests generated at once, their target forwards batched into one (continuous batching: "
                            "requests join and leave between forwards); the rest wait (default: 8)")
    serve.add_argument("--max-num-batched-tokens", type=batched_tokens_value, default="auto", metavar="N|auto",
                       help="tokens (prefill chunks, decode tokens, drafts) in one batched target forward; requests over "
                            "it wait for the next forward, a single larger prompt runs alone. auto (default): one "
                            "--prefill-chunk plus every running request's largest verification (γ+1 or tree nodes+1), "
                            "so prompts are prefilled about one chunk per forward while every decode step rides along "
                            "(a CPU forward is compute-bound from a few dozen rows: bigger forwards only delay first "
                            "tokens); 2048 without chunked prefill")
    serve.add_argument("--prefill-chunk", type=prefill_chunk_value, default="auto", metavar="N|auto",
                       help="chunked prefill: feed a long prompt N tokens per batched forward, so it shares forwards with "
                            "the other requests' decode steps instead of stalling them; auto (default): 256 where the "
                            "target's layers batch bit-identically (int8/int4 on CPU) — 64 for a prompt of over 1024 tokens while other "
                            "requests decode (each of their tokens waits for a forward carrying a chunk) —, else 0 = whole prompts")
    serve.add_argument("--max-num-partial-prefills", type=partial_prefills_value, default="auto", metavar="N|auto",
                       help="prompt passes (or chunks) one batched forward carries (vLLM's name). auto (default): 1 where "
                            "prompts are chunked (CPU: a prompt pass is compute-bound, two in one forward cost their sum "
                            "and both first tokens wait for it), else as many as --max-num-batched-tokens holds")
    serve.add_argument("--pause-speculation-for-prompts", action=argparse.BooleanOptionalAction, default=True,
                       help="while a new request waits for its prompt pass, the running requests draft nothing: no "
                            "draft-model steps before it and no verification rows beside it (a forward carrying a prompt "
                            "is compute-bound, and there a plain decode row commits more per row than a verified draft). "
                            "Output is unchanged (default: on)")
    serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                       help="start each prompt pass from the keys/values earlier prompts computed for the same leading "
                            "tokens (a chat template's system turn, a conversation's earlier turns, a shared preamble), "
                            "for the target and the draft model; usage.prompt_tokens_details.cached_tokens says how many. "
                            "Default: on where it is bit-exact (int8/int4 on the CPU, whose rows do not depend on their "
                            "neighbours), off elsewhere; asking for it on a float mode is an error")
    serve.add_argument("--prefix-cache-gb", type=float, default=DEFAULT_PREFIX_CACHE_GB, metavar="GB",
                       help=f"memory for cached prefixes per model, least recently used dropped first "
                            f"(default: {DEFAULT_PREFIX_CACHE_GB:g}; keys/values are kept in float32 in every mode: ~57 KB "
                            f"per token for the 1.5B target, ~25 KB for the 0.5B draft)")
    serve.add_argument("--block-size", type=positive_int, default=DEFAULT_BLOCK_SIZE, metavar="N",
                       help=f"prefix caching's granularity: prompts share cached keys/values in whole blocks of N tokens "
                            f"(default: {DEFAULT_BLOCK_SIZE})")
    serve.add_argument("--suffix-cache-entries", type=non_negative_int, default=DEFAULT_SUFFIX_CACHE_ENTRIES, metavar="N",
                       help="suffix, draft_suffix: the cap of the table of earlier requests' outputs they draft from (up to "
                            "8 entries per remembered output token, ~0.33 KB each; the oldest requests leave first; vLLM's "
                            "suffix_decoding_max_cached_requests counts requests instead). 0: nothing is kept across "
                            f"requests (default: {DEFAULT_SUFFIX_CACHE_ENTRIES}, ~0.67 GB at the worst)")
    serve.add_argument("--max-queue", type=non_negative_int, default=64,
                       help="waiting requests before HTTP 429 (default: 64; 0: none wait)")
    serve.add_argument("--disable-speculation-above", type=speculation_limit_value, default="auto", metavar="N|auto|never",
                       help="switch speculation off for requests that find more than N requests active or waiting, now or "
                            "on average over the last seconds (a request that started in a lull stays off): their forwards are "
                            "batched, and drafts verified together cost rows where plain decoding costs one each. auto "
                            "(default): the N up to which speculation is expected to beat plain decoding, from the target's "
                            "step costs measured on this machine (never switched off where they are unmeasured: float "
                            "weights, CUDA); never: keep speculating. Under N or never a request sharing forwards drafts at most the "
                            "configured γ, so a token tree verifies no more rows than a chain — with γ=auto, what the "
                            "measured costs price at that load (at least 1)")
    serve.add_argument("--served-model-name", default=None, help="model id clients use (default: the --model value)")
    serve.add_argument("--enable-log-requests", action="store_true",
                       help="log two lines per generation request on stderr: on admission what it asked for (its prompts "
                            "as the model reads them, cut to --max-log-len, their token counts, the sampling parameters "
                            "that differ from the defaults, n and the speculation), and at its end client, method, path, "
                            "status, seconds and the client's X-Request-Id (echoed in the response whether or not this is "
                            "on; vLLM's flag). Default: off")
    serve.add_argument("--max-log-len", type=non_negative_int, default=DEFAULT_MAX_LOG_LEN, metavar="N",
                       help="with --enable-log-requests, the characters of each prompt logged (0: none; vLLM's flag, "
                            f"whose default is all: a long document per request floods the log). Default: {DEFAULT_MAX_LOG_LEN}")
    serve.add_argument("--log-stats-interval", type=stats_interval, default=DEFAULT_STATS_INTERVAL_S, metavar="S",
                       help="every S seconds while requests run, one line on stderr: generation and prompt tokens/s, the "
                            "weights' bytes read per second (GB/s: the speed against memory's limit), requests running and "
                            f"waiting, and the draft tokens accepted (vLLM's throughput line; under --ray in the replicas' logs, "
                            "here with --enable-log-requests). 0: none. Default: "
                            f"{DEFAULT_STATS_INTERVAL_S:g}")
    serve.add_argument("--disable-log-stats", action="store_true", help="no throughput lines (vLLM's flag; "
                       "--log-stats-interval 0)")
    serve.add_argument("--audit-fraction", type=float, default=0.0, metavar="F",
                       help="re-decode this fraction of finished greedy requests plainly while the server is idle and "
                            "compare token ids (/metrics: specdec_audit_total; a mismatch is logged). Default: 0")
    serve.add_argument("--api-key", action="append", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on every /v1/ route, /tokenize, /detokenize, "
                            "/reset_prefix_cache and /reset_suffix_cache (repeat for several keys; also $SPECDEC_API_KEY and "
                            "--api-key-file). /health and /version stay open (/metrics too, unless --metrics-require-key). "
                            "Default: no key (bind 127.0.0.1 only)")
    serve.add_argument("--api-key-file", default=None, metavar="FILE",
                       help="read API keys from FILE, one per line ('#' starts a comment); a missing or empty file is an error")
    serve.add_argument("--metrics-require-key", action="store_true", help="/metrics also requires an API key (default: open)")
    serve.add_argument("--max-body-bytes", type=positive_int, default=DEFAULT_MAX_BODY_BYTES, metavar="N",
                       help=f"refuse request bodies over N bytes with HTTP 413, before reading them (default: {DEFAULT_MAX_BODY_BYTES})")
    serve.add_argument("--max-prompt-tokens", type=positive_int, default=None, metavar="N",
                       help="refuse prompts over N tokens with HTTP 400 (default: only the context window limits them)")
    serve.add_argument("--max-tokens-limit", type=positive_int, default=None, metavar="N",
                       help="refuse max_tokens over N with HTTP 400; also caps the default max_tokens (default: no limit)")
    serve.add_argument("--default-max-tokens", type=default_max_tokens, default=256, metavar="N|context",
                       help="a chat request's max_tokens when it sends none (nor max_completion_tokens): N, or 'context' "
                            "for the rest of the context window, as OpenAI and vLLM (on a CPU such an answer can take "
                            "minutes, and each request's key/value cache is set aside for all of it: ~2.7 GB at the built-in "
                            "pair's 32k context; default: 256). Completions keep OpenAI's legacy 16")
    browser = serve.add_argument_group("browser pages (CORS; vLLM's flags and defaults)")
    browser.add_argument("--allowed-origins", type=string_list, default=["*"], metavar="LIST",
                         help="origins whose pages may read the answers: a JSON list ('[\"http://localhost:3000\"]') or "
                              "comma-separated; '[]' sends no CORS headers (default: [\"*\"], any)")
    browser.add_argument("--allowed-methods", type=string_list, default=["*"], metavar="LIST", help="methods a page may use (default: any)")
    browser.add_argument("--allowed-headers", type=string_list, default=["*"], metavar="LIST", help="headers a page may send (default: any)")
    browser.add_argument("--allow-credentials", action="store_true",
                         help="let pages send cookies and HTTP auth with their requests (default: no)")
    scale = serve.add_argument_group("scale-out on Ray Serve (needs `pip install 'specdec[ray]'`)")
    scale.add_argument("--ray", action="store_true",
                       help="serve the same app as a Ray Serve deployment: --replicas processes, each with its own models "
                            "and model thread, behind Ray's HTTP proxy on --host:--port (which sends each request to the "
                            "less busy of two sampled replicas)")
    scale.add_argument("--replicas", type=positive_int, default=1, metavar="N", help="with --ray: replicas (default: 1)")
    scale.add_argument("--ray-address", default=None, metavar="ADDR",
                       help="with --ray: join this Ray cluster ('auto' = the one `ray start --head` started on this machine; "
                            "host:6379 = a remote head). Default: start a private local cluster that ends with this command")
    scale.add_argument("--ray-cpus-per-replica", type=float, default=1.0, metavar="C",
                       help="with --ray: CPUs Ray reserves for each replica; also its torch threads (default: 1). On one "
                            "machine, replicas x C should not exceed its cores")
    add_debug_flag(serve)
    serve.set_defaults(func=run)
    return serve


def build_state(args: argparse.Namespace, threads: int | None = None) -> "ServerState":
    """Load the models (on the thread that will run them) and make the server's state from the flags.

    ``threads``: torch intra-op threads for this process (a Ray Serve replica sets it to the CPUs it
    was given, so replicas sharing a machine do not oversubscribe its cores)."""
    import specdec
    from specdec.api import enable_prefix_caching
    from specdec.chunking import (LONG_PROMPT_TOKENS, SHARED_PREFILL_CHUNK, default_max_num_batched_tokens, default_prefill_chunk,
                                  prompts_per_forward, rows_independent)
    from specdec.policy import BatchPolicy
    from specdec.server.state import ServerState
    from specdec.server.executor import ModelExecutor
    from specdec.server.security import AccessPolicy, CorsPolicy, load_api_keys

    spec = spec_from_args(args)
    specdec.set_suffix_cache_entries(args.suffix_cache_entries)  # in every process that serves (Ray replicas too)
    if not 0.0 <= args.audit_fraction <= 1.0:
        raise SpecdecError(f"--audit-fraction must be between 0 and 1, got {args.audit_fraction}")
    access = AccessPolicy(load_api_keys(args.api_key, args.api_key_file), args.max_body_bytes, args.metrics_require_key)
    # loads on the thread that will run the model (server/executor.py)
    executor = ModelExecutor()
    if threads is not None:
        import torch

        executor.call(lambda: torch.set_num_threads(threads))

    def load(name: str, quantize: str) -> "specdec.LoadedModel":
        return executor.call(lambda: specdec.load_model(name, args.dtype, args.device, auto_pull=not args.no_pull,
                                                        progress=True, quantize=quantize, prompt_quantize=args.prompt_quantize))

    target_mode, draft_mode, plan = execution_modes(args, spec.method, concurrency=args.max_concurrency)
    if plan is not None and plan.choice is not None and args.quantize == "auto":
        print(plan.choice.summary() + "; --quantize names one instead", file=sys.stderr, flush=True)
    target = load(args.model, target_mode)
    draft = None
    if args.draft_model:
        draft = load(args.draft_model, draft_mode)
        from specdec.compat import check_pair

        check_pair(target, draft)
    # on where exact unless switched off; asked for explicitly, a model where it is not exact refuses
    for model in [m for m in (target, draft) if m is not None and args.enable_prefix_caching is not False]:
        if args.enable_prefix_caching or rows_independent(model.backend):
            enable_prefix_caching(model, args.prefix_cache_gb, args.block_size)
    check_serving_method(target, draft, spec)
    prefill_chunk = default_prefill_chunk(target.backend) if args.prefill_chunk == "auto" else args.prefill_chunk
    executor.max_num_batched_tokens = (default_max_num_batched_tokens(prefill_chunk, args.max_concurrency, spec)
                                       if args.max_num_batched_tokens == "auto" else args.max_num_batched_tokens)
    executor.prompts_per_forward = (prompts_per_forward(prefill_chunk) if args.max_num_partial_prefills == "auto"
                                    else args.max_num_partial_prefills)
    policy = BatchPolicy.from_setting(args.disable_speculation_above, spec, target, draft, args.max_concurrency)
    # what loading left lives as long as the server: a full collection walks it all (~356 k objects with
    # the default pair, 170 ms on a Zen 4 EPYC — a stall of ~6 decode steps wherever one fires); frozen,
    # collections see only what requests allocate (gc.collect after the freeze: 0.0 ms). vLLM does the same.
    gc.collect()
    gc.freeze()
    return ServerState(target=target, model_name=args.served_model_name or args.model, draft=draft, spec=spec,
                       max_concurrency=args.max_concurrency, max_queue=args.max_queue,
                       policy=policy, executor=executor,
                       max_prompt_tokens=args.max_prompt_tokens, max_tokens_limit=args.max_tokens_limit, access=access,
                       cors=CorsPolicy(tuple(args.allowed_origins), tuple(args.allowed_methods), tuple(args.allowed_headers),
                                       args.allow_credentials),
                       chat_default_max_tokens=args.default_max_tokens,
                       audit_fraction=args.audit_fraction, log_requests=args.enable_log_requests, max_log_len=args.max_log_len,
                       stats_interval_s=args.log_stats_interval if stats_wanted(args) else 0.0,
                       prefill_chunk=prefill_chunk, pause_speculation_for_prompts=args.pause_speculation_for_prompts,
                       shared_prefill_chunk=SHARED_PREFILL_CHUNK if args.prefill_chunk == "auto" and prefill_chunk else 0,
                       long_prompt_tokens=LONG_PROMPT_TOKENS, echo_request_id=not args.ray)


def stats_wanted(args: argparse.Namespace) -> bool:
    """Whether the server logs its throughput line (server/stats_log.py)."""
    return not args.disable_log_stats and args.log_stats_interval > 0


def check_serving_method(target: Any, draft: Any, spec: Any) -> None:
    """The server's own method, drafted once for a one-token request before the server opens: a head of the wrong
    kind, a datastore of another tokenizer or a missing --drafter-path would otherwise start a server that answers
    every request with a 400 blaming the client."""
    import torch

    from specdec.api import make_drafter
    from specdec.sampling import SamplingParams

    if spec.method is None:
        return
    try:
        drafter = make_drafter(target, spec, SamplingParams(max_tokens=1), torch.Generator(), 64, draft)
    except SpecdecError as exc:
        raise SpecdecError(f"--method {spec.method}: {exc}") from None
    if drafter is not None:
        drafter.finish()


def build_app(args: argparse.Namespace, threads: int | None = None) -> Any:
    """The OpenAI app with its models loaded: what one process (or one Ray Serve replica) serves."""
    from specdec.server.app import create_app

    from specdec.server.request_log import log_info_to_stderr

    # here, not in run(): a Ray replica builds its own app in a process of its own
    for name, wanted in (("specdec.server.requests", args.enable_log_requests),
                         ("specdec.server.stats", stats_wanted(args))):
        if wanted:
            log_info_to_stderr(name)
    return create_app(build_state(args, threads))


def run(args: argparse.Namespace) -> int:
    check_flag_combinations(args)
    if args.ray:
        return run_on_ray(args)
    if args.replicas != 1 or args.ray_address is not None:
        raise SpecdecError("--replicas and --ray-address need --ray (one process serves without it)")
    import uvicorn

    listening = listening_socket(args.host, args.port)  # before loading: a port in use was found after 43 s of it
    app = build_app(args)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="debug" if args.debug else "warning")
    # bound first, so the address printed is the one that serves (--port 0: the port the OS picked)
    print(startup_line(app.state.specdec, args, listening.getsockname()[1]), file=sys.stderr, flush=True)
    uvicorn.Server(config).run(sockets=[listening])
    return 0


def check_flag_combinations(args: argparse.Namespace) -> None:
    """Flags that only mean something beside another, refused or warned about before anything loads (each was
    silently ignored, or failed after the models had loaded)."""
    typed = getattr(args, "typed_flags", set())
    if "ray_cpus_per_replica" in typed and not args.ray:
        raise SpecdecError("--ray-cpus-per-replica needs --ray (one process serves without it: its threads are the "
                           "process's own)")
    if not args.prefix_cache_gb > 0:
        raise SpecdecError(f"--prefix-cache-gb must be > 0, got {args.prefix_cache_gb:g} (--no-enable-prefix-caching "
                           "switches the cache off)")
    if args.enable_prefix_caching is False and {"prefix_cache_gb", "block_size"} & typed:
        print("warning: --prefix-cache-gb / --block-size are not read with --no-enable-prefix-caching", file=sys.stderr)
    if args.metrics_require_key and not (args.api_key or args.api_key_file or os.environ.get(API_KEY_ENV)):
        raise SpecdecError("--metrics-require-key needs an API key (--api-key, --api-key-file or $SPECDEC_API_KEY): "
                           "without one /metrics would stay open")


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before any model loads (as uvicorn binds it: SO_REUSEADDR, IPv6 for an address
    with ':'), or one clear line: uvicorn's own binding failed after loading, with its log line and exit status 3."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SpecdecError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (--host / --port)") from None
    sock.set_inheritable(True)
    return sock


def run_on_ray(args: argparse.Namespace) -> int:
    """``--ray``: the same app as a Ray Serve deployment of ``--replicas`` processes (server/ray_app.py)."""
    from specdec.server.ray_app import RaySettings, ray_serve, serve_on_ray

    ray_serve()  # not installed: say so before loading anything
    if args.port == 0:
        raise SpecdecError("--ray needs a fixed --port (Ray Serve's proxy binds it on every node)")
    settings = RaySettings(replicas=args.replicas, cpus_per_replica=args.ray_cpus_per_replica, address=args.ray_address,
                           host=args.host, port=args.port,
                           max_ongoing_requests=args.max_concurrency + args.max_queue,
                           # the replicas' output (request and throughput lines) here only when asked: it brings
                           # Ray's controller tracebacks with it (a replica that cannot start was 39 lines)
                           log_to_driver=args.enable_log_requests)
    if settings.address is None:  # a private cluster's proxy binds here: a port in use is one line now, not Ray's
        # proxy's traceback later (a running cluster's proxy may hold the port already, and serve.start reuses it)
        listening_socket(args.host, args.port).close()
    cores = os.cpu_count() or 1
    if settings.address is None and settings.replicas * settings.cpus_per_replica > cores:
        # Ray would start what fits and leave the rest pending for ever, with serve.run waiting on them
        raise SpecdecError(f"--replicas {settings.replicas} x --ray-cpus-per-replica {settings.cpus_per_replica:g} needs "
                           f"more CPUs than this machine's {cores}: lower either, or join a larger cluster with --ray-address")
    import copy

    import torch

    # A bad flag should fail here, once, not in every replica; and `--quantize auto` is resolved here,
    # once, at the replicas' thread count (its step-cost curves are timed and cached per thread count),
    # so replicas starting together do not time their curves against each other.
    spec = spec_from_args(args)
    threads = max(1, int(args.ray_cpus_per_replica))
    driver_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        target_mode, draft_mode, _ = execution_modes(args, spec.method, concurrency=args.max_concurrency)
    finally:
        torch.set_num_threads(driver_threads)
    args = copy.copy(args)
    args.quantize, args.draft_quantize = target_mode, (draft_mode if args.draft_model else None)  # (no warning per replica)
    from specdec.drafters.registry import needs_draft_model

    modes = target_mode + (f", draft {draft_mode}" if args.draft_model and needs_draft_model(spec.method) else "")
    serve_on_ray(lambda: build_app(args, threads), settings,
                 name=f"{args.served_model_name or args.model} ({modes}, speculative: {spec.method or 'off'}"
                      f"{replica_settings(args, spec.method)})")
    return 0
