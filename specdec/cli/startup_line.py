"""The line `specdec serve` prints once it listens: what it serves and how — the model and its execution mode, the
speculation and when it runs, the draft, the caches, the keys, the settings file — so an operator reads from the
terminal what a request will get."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdec.server.state import ServerState


def startup_line(state: "ServerState", args: argparse.Namespace, port: int) -> str:
    """``serving NAME (mode, speculative: …, draft …, caches, keys, settings) on http://HOST:PORT``; ``port``: the one
    bound (``--port 0``: the OS's pick)."""
    host = args.host
    if state.policy.table is not None and state.policy.table_limits and state.spec.method is not None:
        prior = state.policy.table.for_alpha(state.policy.acceptance.alpha) or {}
        alpha = state.policy.acceptance.alpha
        shared = {n: g for n, g in prior.items() if g and n > 1}  # γ while n requests share forwards
        if not shared:  # "γ ≤ ; none above 0 requests" (all zero), "γ ≤ ; none above 1" (--max-concurrency 1) before
            speculative = (f"{state.spec.method} while it pays at the traffic's measured α (at the prior {alpha:.2f}: a "
                           "request alone drafts with its own γ, none while others share its forwards)")
        else:
            speculative = (f"{state.spec.method} while it pays at the traffic's measured α (at the prior {alpha:.2f}: γ ≤ "
                           + ", ".join(f"{g} for {n}" for n, g in shared.items()) + f"; none above {max(shared)} requests)")
    else:
        limit = state.policy.limit
        speculative = (state.spec.method or "off") + ("" if state.spec.method is None or limit is None
                                                      else f" while at most {limit} request(s) are active") + (
            "; γ=auto sized by the measured costs at each load" if state.policy.table is not None else "")
    cache = state.target.backend.prefix_cache
    prefixes = (f"prefix cache {cache.max_bytes / 1e9:g} GB per model in blocks of {cache.block_size} tokens"
                if cache is not None else "no prefix cache")
    hint = "" if state.spec.method is not None or state.draft is not None else (
        " (speculative decoding needs a drafter: --draft-model D — qwen2.5-coder-0.5b for the default target — or a "
        "draft-free --method suffix)")
    # the draft and the settings file named too: a tune.json's choice was served without saying which draft ran
    drafting = (f", draft {os.path.basename(str(args.draft_model).rstrip('/'))} ({state.draft.backend.mode})"
                if state.draft is not None else "")
    from specdec.drafters.suffix import global_cache_entries  # (torch: not at the CLI's import, --help stays quick)

    # the suffix cap this process applied (--suffix-cache-entries)
    served = served_with(state.spec.method, global_cache_entries(), len(state.access.api_keys), args.config)
    return (f"serving {state.model_name} ({state.target.backend.mode}, speculative: {speculative}{drafting}, {prefixes}"
            f"{served}) on http://{host}:{port}{hint}")


def replica_settings(args: argparse.Namespace, method: str | None) -> str:
    """What ``--ray``'s start-up line can say of its replicas' settings from the flags (each replica loads its own
    models): the suffix table's cap, the API keys, the settings file — ``, …``."""
    from specdec.server.security import load_api_keys

    return served_with(method, args.suffix_cache_entries, len(load_api_keys(args.api_key, args.api_key_file)), args.config)


def served_with(method: str | None, suffix_entries: int, api_keys: int, config: str | None) -> str:
    """The start-up lines' common tail: ``, suffix cache …`` (suffix methods), ``, N API key(s)``, ``, settings from …``."""
    parts = ([f"suffix cache ≤ {suffix_entries} entries" if suffix_entries else "no suffix cache across requests"]
             if method in ("suffix", "draft_suffix") else [])
    parts.append(f"{api_keys} API key(s)" if api_keys else "no API key")
    if config:
        parts.append(f"settings from {config}")
    return "".join(f", {part}" for part in parts)
