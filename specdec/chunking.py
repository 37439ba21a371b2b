"""How prompt passes share batched forwards with other requests' decode steps (chunked prefill): the chunk a
prompt is fed in, the rule that shrinks a long prompt's chunks while others decode, and how many rows and
prompts one forward carries. The server (``--prefill-chunk``, ``--max-num-batched-tokens``) and the offline
batch API (:func:`specdec.generate_batch`) read the same defaults here."""

from __future__ import annotations

from typing import Callable

from specdec.backends.torch_backend import TorchBackend
from specdec.config import SpecConfig


#: prompt tokens per target call when a prefill is chunked (see :func:`default_prefill_chunk`)
PREFILL_CHUNK = 256
#: … for a long prompt while other requests decode (the server with --prefill-chunk auto): each of their tokens
#: waits for a forward carrying a chunk, which on a CPU costs its rows. Measured (Zen 4, int8 target, a 3300-token
#: prompt then a 16-token completion 1.5 s later): 256-token chunks, the short request took 15.9 s (1 token/s); 64,
#: 4.9 s, and the long prompt's first token came 8 % later (18.5 vs 17.1 s) …
SHARED_PREFILL_CHUNK = 64
#: … where more than this many prompt tokens are still to feed. A short prompt keeps whole chunks: split under
#: steady load (8 concurrent MT-Bench requests) it took more forwards to its first token — median TTFT 1.21 s
#: against 0.69 s, total tokens/s 0.97× — for a stall of one chunk it costs the others anyway.
LONG_PROMPT_TOKENS = 4 * PREFILL_CHUNK


def shared_prefill_chunk(chunk: int, others_in_flight: Callable[[], bool], shared: int | None = None,
                         long_prompt: int | None = None) -> Callable[[int, int], int]:
    """The server's and the batch API's chunk rule (``--prefill-chunk auto``): ``chunk`` tokens a call, but at most
    ``shared`` for a prompt pass of over ``long_prompt`` tokens while other requests are in flight (``others_in_flight``:
    :meth:`specdec.scheduler.Batcher.others_in_flight`) — for the whole pass: the
    rule once looked at the tokens still to feed, so a long prompt's last 1024 went in 256-token calls and the others'
    tokens waited ~2 s each (Zen 4, int8, a 3700-token prompt beside two streams). ``shared`` 0: always ``chunk``;
    None: SHARED_PREFILL_CHUNK (``long_prompt`` None: LONG_PROMPT_TOKENS)."""
    shared = SHARED_PREFILL_CHUNK if shared is None else shared
    long_prompt = LONG_PROMPT_TOKENS if long_prompt is None else long_prompt

    def next_chunk(remaining: int, total: int) -> int:
        if shared and chunk and total > long_prompt and others_in_flight():
            return min(chunk, shared)
        return chunk

    return next_chunk


def rows_independent(backend: TorchBackend) -> bool:
    """Do a model's forwards (``LoadedModel.backend``) compute every row on its own, prompt passes included (the
    int8/int4 CPU paths)? Then a row's keys, values and logits do not depend on which rows share its forward:
    chunked prefill and prefix caching are bit-exact. Float GEMMs may round a chunk differently."""
    return backend.decoder.ragged_layer_runner is not None and backend.prompt_backend.decoder.ragged_layer_runner is not None


def default_prefill_chunk(target: TorchBackend) -> int:
    """Chunked prefill's chunk for a target (``LoadedModel.backend``): PREFILL_CHUNK where its rows are computed
    independently (:func:`rows_independent`: a chunked prompt's logits are bit-identical to one
    pass), else 0 — the whole prompt in one call."""
    return PREFILL_CHUNK if rows_independent(target) else 0


#: rows of one batched forward where prompts are not chunked (float weights, CUDA): it must hold them
WHOLE_PROMPT_BATCH_TOKENS = 2048


def default_max_num_batched_tokens(prefill_chunk: int, max_num_seqs: int, spec: SpecConfig | None = None) -> int:
    """Rows of one batched target forward: with chunked prefill, one prompt chunk plus every running
    request's largest verification (γ + 1 rows, or a tree's nodes + 1), so each forward carries all
    decode steps and at most ~one chunk of prompt. Why not more: a CPU forward is compute-bound from
    a few dozen rows, so a forward of several prompts at once only delays everyone's next token —
    measured on a VNNI EPYC with 8 concurrent 64-token completions, 320 rows instead of 2048 gave
    median TTFT 2.47 s instead of 3.24 s and 1.08× the total tokens/s. Without chunking (0):
    :data:`WHOLE_PROMPT_BATCH_TOKENS`."""
    if prefill_chunk <= 0:
        return WHOLE_PROMPT_BATCH_TOKENS
    spec = spec or SpecConfig()
    return prefill_chunk + max_num_seqs * (max(spec.max_speculative_tokens, spec.max_tree_nodes) + 1)


def prompts_per_forward(prefill_chunk: int) -> int | None:
    """Prompt passes one batched forward may carry (:class:`specdec.scheduler.Batcher`): one where
    prompts are chunked (the CPU modes, where a prompt pass is compute-bound: two together cost their
    sum, and both first tokens would wait for it), else None (as many as the rows allow: on a GPU a
    forward of several prompts costs little more than one)."""
    return 1 if prefill_chunk > 0 else None
