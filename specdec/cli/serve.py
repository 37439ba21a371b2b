"""``specdec serve``: an OpenAI-compatible HTTP server (completions and chat, SSE streaming,
/v1/models, /health, Prometheus /metrics) that decodes speculatively. The flags set the server's
default method and γ; a request may override them with a ``speculative`` field. Models load on the
thread that will run them (:class:`specdec.server.executor.ModelExecutor`); the app is
:mod:`specdec.server.app`."""

from __future__ import annotations

import argparse
import sys

from specdec.cli.common import add_debug_flag, add_model_args, execution_modes, positive_int, spec_from_args
from specdec.errors import SpecdecError
from specdec.server.security import DEFAULT_MAX_BODY_BYTES


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    serve = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server with speculative decoding",
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
                       help="switch speculation off (per step) while more than N requests are active: drafting costs throughput under load (default: never)")
    serve.add_argument("--served-model-name", default=None, help="model id clients use (default: the --model value)")
    serve.add_argument("--audit-fraction", type=float, default=0.0, metavar="F",
                       help="re-decode this fraction of finished greedy requests plainly while the server is idle and "
                            "compare token ids (/metrics: specdec_audit_total; a mismatch is logged). Default: 0")
    serve.add_argument("--api-key", action="append", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on every /v1/ route (repeat for several keys; also "
                            "$SPECDEC_API_KEY and --api-key-file). /health stays open. Default: no key (bind 127.0.0.1 only)")
    serve.add_argument("--api-key-file", default=None, metavar="FILE",
                       help="read API keys from FILE, one per line ('#' starts a comment); a missing or empty file is an error")
    serve.add_argument("--metrics-require-key", action="store_true", help="/metrics also requires an API key (default: open)")
    serve.add_argument("--max-body-bytes", type=positive_int, default=DEFAULT_MAX_BODY_BYTES, metavar="N",
                       help=f"refuse request bodies over N bytes with HTTP 413, before reading them (default: {DEFAULT_MAX_BODY_BYTES})")
    serve.add_argument("--max-prompt-tokens", type=positive_int, default=None, metavar="N",
                       help="refuse prompts over N tokens with HTTP 400 (default: only the context window limits them)")
    serve.add_argument("--max-tokens-limit", type=positive_int, default=None, metavar="N",
                       help="refuse max_tokens over N with HTTP 400; also caps the default max_tokens (default: no limit)")
    add_debug_flag(serve)
    serve.set_defaults(func=run)
    return serve


def run(args: argparse.Namespace) -> int:
    import uvicorn

    import specdec
    from specdec.server.app import ServerState, create_app
    from specdec.server.executor import ModelExecutor
    from specdec.server.security import AccessPolicy, load_api_keys

    spec = spec_from_args(args)
    if not 0.0 <= args.audit_fraction <= 1.0:
        raise SpecdecError(f"--audit-fraction must be between 0 and 1, got {args.audit_fraction}")
    access = AccessPolicy(load_api_keys(args.api_key, args.api_key_file), args.max_body_bytes, args.metrics_require_key)
    executor = ModelExecutor()  # loads on the thread that will run the model (server/executor.py)

    def load(name: str, quantize: str) -> "specdec.LoadedModel":
        return executor.call(lambda: specdec.load_model(name, args.dtype, args.device, auto_pull=not args.no_pull,
                                                        progress=True, quantize=quantize))

    target_mode, draft_mode, _ = execution_modes(args, spec.method)
    target = load(args.model, target_mode)
    draft = None
    if args.draft_model:
        draft = load(args.draft_model, draft_mode)
        from specdec.compat import check_pair

        check_pair(target, draft)
    state = ServerState(target=target, model_name=args.served_model_name or args.model, draft=draft, spec=spec,
                        max_concurrency=args.max_concurrency, max_queue=args.max_queue,
                        disable_speculation_above=args.disable_speculation_above, executor=executor,
                        max_prompt_tokens=args.max_prompt_tokens, max_tokens_limit=args.max_tokens_limit, access=access,
                        audit_fraction=args.audit_fraction)
    keys = f"{len(access.api_keys)} API key(s)" if access.api_keys else "no API key"
    print(f"serving {state.model_name} ({target.backend.dtype_name}, speculative: {spec.method or 'off'}, {keys}) "
          f"on http://{args.host}:{args.port}",
          file=sys.stderr, flush=True)
    uvicorn.run(create_app(state), host=args.host, port=args.port, log_level="debug" if args.debug else "warning")
    return 0
