"""The offline batch API: many prompts through the server's continuous batching, on the caller's thread.

:func:`generate_batch` is vLLM's ``LLM.generate`` shape: a :class:`~specdec.scheduler.Batcher` serves up
to ``max_num_seqs`` requests' model calls in shared forwards, and the server's speculation policy
(:mod:`specdec.policy`) decides how much each drafts while they share them.
"""

from __future__ import annotations

import numbers
from typing import Callable, Sequence

from specdec.api import LIBRARY_CALLS, LoadedModel, Prompt, check_target, encode_prompt, prepare, resolve_spec
from specdec.chunking import default_max_num_batched_tokens, default_prefill_chunk, prompts_per_forward, shared_prefill_chunk
from specdec.config import SpecConfig
from specdec.engine import GenerationResult, StreamChunk, check_context, collect, generate_steps
from specdec.errors import SpecdecError
from specdec.policy import BatchPolicy, RequestGate
from specdec.sampling import SamplingParams
from specdec.scheduler import END, Batcher, Stream


def is_count(value: object) -> bool:
    """An integer (a NumPy one too) that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def generate_batch(
    target: LoadedModel,
    prompts: Sequence[Prompt],
    params: SamplingParams | Sequence[SamplingParams] | None = None,
    *,
    draft: LoadedModel | None = None,
    spec: SpecConfig | None = None,
    chat: bool = False,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int | None = None,
    prefill_chunk: int | None = None,
    progress: bool = False,
    disable_speculation_above: int | str = "auto",
    pause_speculation_for_prompts: bool = True,
) -> list[GenerationResult]:
    """Generate a completion for every prompt (vLLM's ``LLM.generate`` shape), up to ``max_num_seqs``
    at a time through continuous batching: the requests' target forwards — prefills, drafts and
    trees to verify — share one forward of up to ``max_num_batched_tokens`` rows
    (:class:`specdec.scheduler.Batcher`; None: :func:`default_max_num_batched_tokens`), on this thread. Each result equals :func:`generate` of that
    prompt alone: bit-identical logits per request where the target batches (int8/int4 on CPU), the
    same forwards one by one elsewhere. ``params``: one for all prompts, or one per prompt.
    ``prefill_chunk``: prompt tokens per call (None: :func:`default_prefill_chunk`, and a prompt of over
    LONG_PROMPT_TOKENS in SHARED_PREFILL_CHUNK pieces while other requests are in flight — decoding, or in their own
    prompt pass, which runs first — as the server's ``--prefill-chunk auto``:
    :func:`specdec.chunking.shared_prefill_chunk`; N: always N; 0: whole prompts). How much requests draft while they share forwards is the server's policy
    (:mod:`specdec.policy`): ``disable_speculation_above`` ``"auto"`` — γ per number of requests in
    flight from the measured step costs and the batch's α so far (0 where speculating would cost
    throughput) —, N (no drafts with more than N requests in flight) or ``"never"``;
    ``pause_speculation_for_prompts``: while a request waits for its prompt pass, the running ones
    draft nothing (:meth:`specdec.scheduler.Batcher.prompt_pending`). Results come back in the
    prompts' order."""
    check_target(target)
    if not isinstance(prompts, (list, tuple)):  # a string ran one request per character
        raise TypeError(f"prompts must be a list of prompts (one prompt: specdec.generate), got {type(prompts).__name__}")
    for name, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
        if (value is not None or name == "max_num_seqs") and (not is_count(value) or value < 1):  # "8": a TypeError later
            raise SpecdecError(f"{name} must be an integer >= 1, got {value!r}")
    if prefill_chunk is not None and (not isinstance(prefill_chunk, int) or isinstance(prefill_chunk, bool) or prefill_chunk < 0):
        raise SpecdecError(f"prefill_chunk must be an integer >= 0 (0: whole prompts; None: the default), got {prefill_chunk!r}")
    per_prompt = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    if len(per_prompt) != len(prompts):
        raise SpecdecError(f"{len(per_prompt)} SamplingParams for {len(prompts)} prompts: give one, or one per prompt")
    chunk = default_prefill_chunk(target.backend) if prefill_chunk is None else prefill_chunk
    if max_num_batched_tokens is None:
        max_num_batched_tokens = default_max_num_batched_tokens(chunk, max_num_seqs, spec)
    for index, (prompt, prompt_params) in enumerate(zip(prompts, per_prompt)):  # a bad prompt fails before any work,
        if prompt_params is not None and not isinstance(prompt_params, SamplingParams):
            raise TypeError(f"params must be SamplingParams (or a list of them), got {type(prompt_params).__name__}")
        try:  # named by its index (an empty or too long one failed the whole batch, unnamed, when it was admitted)
            ids = encode_prompt(target, prompt, chat)
            check_context(len(ids), (prompt_params or SamplingParams()).max_tokens, target.config.max_position_embeddings)
        except SpecdecError as exc:
            raise type(exc)(f"prompt {index}: {exc}") from None
    jobs: list[dict] = [{} for _ in prompts]  # each request's engine arguments, made when it is admitted
    chunks: list[list[StreamChunk]] = [[] for _ in prompts]
    failures: list[BaseException] = []
    # how much each request may draft while others share its forwards (the server's policy, read
    # against the exact number of requests in flight, its curves corrected by the forwards' costs)
    policy = BatchPolicy.from_setting(disable_speculation_above, resolve_spec(spec, draft), target, draft, max_num_seqs)
    batcher = Batcher(max_num_batched_tokens, policy.costs.observe, prompts_per_forward(chunk))
    # a long prompt's chunks shrink while others decode (a short request's 40 tokens waited 34 s on a 2787-token
    # prompt in 256-token chunks); a chunk the caller gave is used as given, as the server's --prefill-chunk N
    next_chunk = shared_prefill_chunk(chunk, batcher.others_in_flight) if prefill_chunk is None else chunk
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), desc="generate", unit="prompt")

    def deliver_to(index: int) -> Callable[[object], None]:
        def deliver(item: object) -> None:
            if item is END:
                if bar is not None:
                    bar.update(1)
            elif isinstance(item, BaseException):
                failures.append(item)
            else:
                chunks[index].append(item)  # type: ignore[arg-type]
                policy.observe_rounds(item.rounds)  # type: ignore[attr-defined] - the traffic's α, as it runs
                if item.stats is not None:  # type: ignore[attr-defined] - the last chunk: prompt share for the next
                    policy.observe_finished(item.stats)  # type: ignore[attr-defined]
        return deliver

    waiting = list(range(len(prompts)))
    with LIBRARY_CALLS:  # the whole batch: one library call at a time in this process (specdec.api)
        try:
            while (waiting or batcher.streams) and not failures:
                while waiting and len(batcher.streams) < max_num_seqs:
                    index = waiting.pop(0)
                    # the drafter (a draft KV cache) exists only while its request runs
                    jobs[index] = prepare(target, prompts[index], per_prompt[index], draft, spec, chat)
                    gate = RequestGate(lambda: policy.cap(len(batcher.streams)),
                                       batcher.prompt_pending if pause_speculation_for_prompts else None)
                    steps = generate_steps(**jobs[index], prefill_chunk=next_chunk, speculate=gate,
                                           alpha_prior=policy.measured_alpha(),
                                           saving_under_load=lambda: policy.saving(len(batcher.streams)))
                    batcher.add(Stream(steps, deliver_to(index), lambda: False))
                batcher.step()
        finally:
            for stream in batcher.streams:  # after a failure: the others' cleanup (drafter state) runs
                stream.steps.close()
            if bar is not None:
                bar.close()
    if failures:
        raise failures[0]
    return [collect(c, job["prompt_ids"], job["params"]) for c, job in zip(chunks, jobs)]
