"""The public Python API: load models, generate (plainly or speculatively), stream.

>>> import specdec
>>> target = specdec.load_model("qwen2.5-coder-1.5b")  # on the CPU: the execution mode measured fastest here
>>> draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")  # a draft's precision moves only α
>>> out = specdec.generate(target, "def fibonacci(n):", specdec.SamplingParams(temperature=0, max_tokens=64),
...                        draft=draft, spec=specdec.SpecConfig(num_speculative_tokens=4))
>>> out.text, out.stats.acceptance_rate
"""

from __future__ import annotations

import dataclasses
import numbers
import threading
import warnings
from typing import Iterator, Union

import torch

from specdec.chunking import rows_independent
from specdec.compat import check_draft_context, check_pair
from specdec.config import DEFAULT_BLOCK_SIZE, DEFAULT_DRAFT_METHOD, DEFAULT_PREFIX_CACHE_GB, SpecConfig
from specdec.drafters.base import Drafter, DrafterResources
from specdec.drafters.registry import (all_methods, build_drafter, method_info, needs_draft_model, resolve_method,
                                       unread_options)
from specdec.engine import GenerationResult, StreamChunk, check_context, generate_ids, generate_stream
from specdec.errors import SpecdecError, UnreadOptionWarning
from specdec.output import request_stop_ids
from specdec.prefix_cache import PrefixCache
from specdec.sampling import SamplingParams, make_generator
from specdec.penalties import check_token_ids
from specdec.prediction import prediction_ids
from specdec.structured import GrammarConstraint
# loading lives in specdec.loading; these names stay importable from here, as they always were
from specdec.loading import (CPU_QUANTIZE_MODES, DTYPES, LoadedModel, load_model, plan_execution,  # noqa: F401
                             resolve_device, resolve_dtype, resolve_prompt_quantize, resolve_quantize)

Prompt = Union[str, list[int], list[dict[str, str]]]

#: one library call (generate, a stream's step, generate_batch) at a time in this process, whatever thread makes it:
#: the suffix table, prefix caches and thread counts are shared by every call, and two threads' forwards on the same
#: cores gain nothing (a walkthrough: 4 threads × 4 calls took 18.0 s, one serial round of 4 5.5 s). Re-entrant: a
#: stream suspended in a thread and a generate call in that thread interleave, as they always could.
LIBRARY_CALLS = threading.RLock()


def encode_prompt(model: LoadedModel, prompt: Prompt, chat: bool = False) -> list[int]:
    """Text → ids (chat=True renders ``[{"role": "user", "content": prompt}]`` with the chat template);
    a list of message dicts is always rendered; a list of ints is taken as is. Anything else is a TypeError
    that says what a prompt is (a tensor, bytes or a list of strings went deep before: a torch error, garbage ids)."""
    if isinstance(prompt, str):
        if chat:
            return model.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        return model.tokenizer.encode(prompt)
    if not isinstance(prompt, (list, tuple)):
        hint = " (a tensor: pass .tolist())" if hasattr(prompt, "tolist") else ""
        raise TypeError(f"a prompt is text, chat messages (a list of dicts) or token ids (a list of ints), got "
                        f"{type(prompt).__name__}{hint}")
    if prompt and isinstance(prompt[0], dict):
        return model.tokenizer.apply_chat_template(prompt)  # type: ignore[arg-type]
    wrong = next((t for t in prompt if not isinstance(t, numbers.Integral) or isinstance(t, bool)), None)
    if wrong is not None:
        raise TypeError(f"prompt token ids must be integers, got {wrong!r} ({type(wrong).__name__}); text goes in as one string")
    ids = [int(t) for t in prompt]
    vocab = model.config.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:  # else an IndexError deep in the embedding
        raise SpecdecError(f"prompt token ids must be in 0..{vocab - 1}; got {bad[:5]}")
    return ids


def make_drafter(
    target: LoadedModel,
    spec: SpecConfig,
    params: SamplingParams,
    generator: torch.Generator,
    max_seq_len: int,
    draft: LoadedModel | None = None,
    constraint: GrammarConstraint | None = None,
) -> Drafter | None:
    """Build the per-request drafter named by ``spec.method`` (None for plain decoding).

    ``draft`` is used only by methods that need a draft model (and then required); others ignore
    it, so a caller may pass the loaded draft whatever the method."""
    predicted = prediction_ids(params.prediction, target.tokenizer, target.config.vocab_size,
                               target.config.max_position_embeddings)  # checked even where no drafter reads it
    if spec.method is None:
        return None
    # the engine caps its cache and every round's room at the target's context (engine.generate_stream), so no
    # draft position goes past it: a request that fits the context fits a draft of the same context too
    max_seq_len = min(max_seq_len, target.config.max_position_embeddings)
    info = method_info(spec.method)
    if info.needs_draft_model:
        if draft is None:
            raise SpecdecError(f"method {info.name!r} needs a draft model: --draft-model NAME_OR_PATH (the library: "
                               "draft=specdec.load_model(NAME_OR_PATH); SpecConfig.draft_model only names it)")
        check_pair(target, draft)
        check_draft_context(draft, max_seq_len)
    resources = DrafterResources(target_backend=target.backend, spec=spec, params=params, generator=generator,
                                 max_seq_len=max_seq_len, tokenizer=target.tokenizer, target_path=target.path,
                                 draft_backend=draft.backend if info.needs_draft_model and draft is not None else None,
                                 constraint=constraint, prediction_ids=predicted,
                                 stop_ids=request_stop_ids(params, target.tokenizer))
    return build_drafter(info, resources)


def resolve_spec(spec: SpecConfig | None, draft: LoadedModel | None) -> SpecConfig:
    """``spec``, or the defaults; a draft model given without a method is used (DEFAULT_DRAFT_METHOD). A method
    named by an alias or a plain name (``SpecConfig(method="ar")``, what ``Stats.method`` reports for plain
    decoding, was an unknown method here while the CLI took it) becomes its registered name, or None."""
    spec = spec or SpecConfig()
    if spec.method is not None:
        method = resolve_method(spec.method)
        return spec if method == spec.method else dataclasses.replace(spec, method=method)
    if draft is not None:
        spec = dataclasses.replace(spec, method=DEFAULT_DRAFT_METHOD)
    return spec


def check_target(target: object) -> None:
    """The model argument of generate / stream / generate_batch (a model name passed as the model was an
    AttributeError deep in generate_batch)."""
    if not isinstance(target, LoadedModel):
        raise TypeError(f"target must be a LoadedModel (specdec.load_model(name_or_path) makes one), got {type(target).__name__}")


def prepare(target: LoadedModel, prompt: Prompt, params: SamplingParams | None, draft: LoadedModel | None,
             spec: SpecConfig | None, chat: bool) -> dict:
    """The keyword arguments of :func:`specdec.engine.generate_stream` (shared by :func:`stream`,
    :func:`generate` and the server): ids, params, spec, generator, this request's drafter and,
    for structured output, its grammar state (the drafter masks its distribution with the same one)."""
    check_target(target)
    for name, value, kind in (("draft", draft, LoadedModel), ("params", params, SamplingParams), ("spec", spec, SpecConfig)):
        if value is not None and not isinstance(value, kind):  # optional: None takes the default
            loaded = " (specdec.load_model(name_or_path) makes one)" if kind is LoadedModel else ""
            raise TypeError(f"{name} must be a {kind.__name__}{loaded}, got {type(value).__name__}")
    # copies checked again: a field changed after construction (``p.temperature = -1`` in a notebook) skipped the
    # checks and decoded garbage, or failed deep in sampling (top_p 0)
    params = dataclasses.replace(params) if params is not None else SamplingParams()
    spec = resolve_spec(dataclasses.replace(spec) if spec is not None else None, draft)
    prompt_ids = encode_prompt(target, prompt, chat)
    # here, not only in the engine's generator: stream() returns a generator, and its errors surfaced at the first
    # next() — a try around the stream(...) call caught nothing
    check_context(len(prompt_ids), params.max_tokens, target.config.max_position_embeddings)
    generator = make_generator(params.seed, target.backend.device)
    max_seq_len = len(prompt_ids) + params.max_tokens + spec.max_speculative_tokens + 1
    for field, ids in (("logit_bias", params.logit_bias), ("stop_token_ids", params.stop_token_ids)):
        check_token_ids(field, ids, target.config.vocab_size)  # before anything runs: a clear 400 in a server
    constraint = None
    if params.structured is not None:
        constraint = GrammarConstraint.build(params.structured, target.tokenizer, target.config.vocab_size)
    drafter = make_drafter(target, spec, params, generator, max_seq_len, draft, constraint)
    return dict(target=target.backend, prompt_ids=prompt_ids, params=params, drafter=drafter, spec=spec,
                tokenizer=target.tokenizer, generator=generator, constraint=constraint)


def stream(
    target: LoadedModel,
    prompt: Prompt,
    params: SamplingParams | None = None,
    *,
    draft: LoadedModel | None = None,
    spec: SpecConfig | None = None,
    chat: bool = False,
) -> Iterator[StreamChunk]:
    """Yield :class:`StreamChunk` s as tokens are committed; the last one carries ``stats``."""
    warn_unread(draft, spec)
    with LIBRARY_CALLS:
        return locked_steps(generate_stream(**prepare(target, prompt, params, draft, spec, chat)))


def generate(
    target: LoadedModel,
    prompt: Prompt,
    params: SamplingParams | None = None,
    *,
    draft: LoadedModel | None = None,
    spec: SpecConfig | None = None,
    chat: bool = False,
) -> GenerationResult:
    """Generate a completion; speculative when ``draft`` or ``spec.method`` is given. Always exact:
    greedy output equals plain decoding's, sampled output has the target's distribution."""
    warn_unread(draft, spec)
    with LIBRARY_CALLS:
        return generate_ids(**prepare(target, prompt, params, draft, spec, chat))


def locked_steps(chunks: Iterator[StreamChunk]) -> Iterator[StreamChunk]:
    """``chunks`` advanced one step at a time under :data:`LIBRARY_CALLS`, not held between steps: a stream left
    suspended blocks no other thread."""
    try:
        while True:
            with LIBRARY_CALLS:
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk
    finally:
        with LIBRARY_CALLS:
            chunks.close()


def warn_unread(draft: LoadedModel | None, spec: SpecConfig | None) -> None:
    """A ``draft=`` or SpecConfig options the chosen method does not read: a UserWarning each (the CLI warns about
    the same flags; the library ignored them without a word). Not an error: the output is the method's."""
    if not isinstance(spec, SpecConfig) and spec is not None:
        return  # prepare's TypeError says what is wrong
    spec = resolve_spec(spec, draft)
    method = spec.method
    if draft is not None and not needs_draft_model(method):
        warnings.warn(f"draft= is not used by {method or 'plain decoding'} (methods that draft with a model: "
                      f"{', '.join(info.name for info in all_methods() if info.needs_draft_model)})", UnreadOptionWarning,
                      stacklevel=3)
    options = sorted({option for info in all_methods() for option in info.options})
    unread = [option for option, _ in unread_options(method, {option: getattr(spec, option) for option in options})]
    if unread:
        warnings.warn(f"{method or 'plain decoding'} does not read SpecConfig {', '.join(unread)}", UnreadOptionWarning,
                      stacklevel=3)


def reset_suffix_cache() -> None:
    """Forget the outputs the ``suffix`` and ``draft_suffix`` methods remember across requests in this process (the
    server's ``POST /reset_suffix_cache``). Call it between timed runs of the same prompts: a second run drafts from
    the first's output (α 1.0 where the first had 0.0), which no new traffic gets."""
    from specdec.drafters.suffix import clear_global_caches

    clear_global_caches()


def set_suffix_cache_entries(max_entries: int) -> None:
    """Cap the table of earlier requests' outputs that ``suffix`` and ``draft_suffix`` draft from (the server's
    ``--suffix-cache-entries``): up to 8 entries per remembered output token, ~0.33 KB each; the oldest requests are
    dropped above the cap. 0 keeps nothing across requests (each drafts from its own prompt and output only). Default:
    2 000 000 (~0.67 GB at the worst)."""
    from specdec.drafters.suffix import set_global_cache_entries

    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
        raise SpecdecError(f"max_entries must be an integer >= 0, got {max_entries!r}")
    set_global_cache_entries(max_entries)


def enable_prefix_caching(model: LoadedModel, gb: float = DEFAULT_PREFIX_CACHE_GB,
                          block_size: int = DEFAULT_BLOCK_SIZE) -> PrefixCache:
    """Let ``model``'s requests start from the keys/values earlier prompts computed for the same
    leading tokens (specdec/prefix_cache.py), within ``gb`` gigabytes. Exact only where rows are
    computed independently (:func:`rows_independent`), so refused elsewhere rather than changing
    outputs. Returns the cache (its ``hit_tokens`` / ``queried_tokens`` count its use)."""
    if not rows_independent(model.backend):
        raise SpecdecError(f"prefix caching is exact only where prompt passes compute each row on its own "
                           f"(--quantize int8, int4 or int4-all on the CPU); {model.backend.dtype_name} on "
                           f"{model.backend.device} may round a shorter prompt pass differently")
    if gb < 0:
        raise SpecdecError(f"the prefix cache's size must be >= 0 GB, got {gb}")
    probe = model.backend.new_state(block_size)
    block_bytes = 2 * probe.k.numel() * probe.k.element_size()
    if gb * 1e9 < block_bytes:  # it held nothing, and every response said cached_tokens 0
        raise SpecdecError(f"a prefix cache of {gb:g} GB holds no block of {model.name} (one block of {block_size} tokens: "
                           f"{block_bytes / 1e6:.2f} MB of keys/values); give more, or switch it off")
    model.backend.prefix_cache = PrefixCache(int(gb * 1e9), block_size)
    return model.backend.prefix_cache
