"""One request's generation in the server (:class:`Job`): set up and stepped on the model thread,
consumed by the event loop — its chunks, usage and the response bodies built from them; and opening a
request's choices on concurrency slots (:func:`open_jobs`)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable

from specdec.api import prepare
from specdec.config import SpecConfig
from specdec.drafters.registry import needs_draft_model
from specdec.engine import generate_steps
from specdec.errors import DrafterError, SpecdecError, StructuredOutputError, WeightsError
from specdec.policy import RequestGate
from specdec.sampling import SamplingParams, TokenLogprob
from specdec.server.audit import AuditCase
from specdec.server.errors import generation_failure
from specdec.server.executor import END
from specdec.server.responses import (TextOffsets, completion_logprobs, joined_logprobs, logprobs_body, usage_body,
                                      vllm_prompt_logprobs)
from specdec.server.params import APIError, field_named
from specdec.server.state import ServerState
from specdec.server.tools import RequestTools, answered_message
from specdec.tokenizer import Tokenizer


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index`` of a request's ``n``: a seeded request's choices use seeds seed, seed + 1, …
    (so they differ, and each is reproducible); greedy choices are all the same text."""
    if index == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + index) % 2**63)


def response_id(job_id: str, chat: bool) -> str:
    """OpenAI's id for a response: ``chatcmpl-…`` for chat, ``cmpl-…`` for completions (a job's own id)."""
    return f"chat{job_id}" if chat else job_id


def chunk_body(job: Job, chat: bool, delta: Any, finish_reason: str | None, index: int = 0,
               request_id: str | None = None) -> dict[str, Any]:
    choice = {"index": index, "finish_reason": finish_reason}
    choice.update({"delta": delta} if chat else {"text": delta, "logprobs": None})
    return {"id": response_id(request_id or job.id, chat), "object": "chat.completion.chunk" if chat else "text_completion",
            "created": job.created, "model": job.state.model_name, "choices": [choice]}


def completion_prompts(prompt: str | list, suffix: str | None = None, tokenizer: Tokenizer | None = None) -> list[str | list[int]]:
    """A completions request's prompts: OpenAI's ``prompt`` is one (text or token ids) or a list of
    them. With a ``suffix`` each text prompt becomes the model's fill-in-the-middle prompt (its
    tokens: :meth:`Tokenizer.fill_in_the_middle`)."""
    prompts = [prompt] if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int) else list(prompt)
    if suffix is None:
        return prompts
    if not all(isinstance(text, str) for text in prompts):
        raise APIError(400, "suffix needs text prompts (not token ids)", param="suffix")
    assert tokenizer is not None
    try:
        return [tokenizer.fill_in_the_middle(text, suffix) for text in prompts]
    except SpecdecError as exc:
        raise APIError(400, str(exc), param="suffix") from None


def full_response(jobs: list[Job], chat: bool, n: int = 1, calls: RequestTools | None = None) -> dict[str, Any]:
    """The non-streamed body of a request's choices (one job each, in index order: by prompt, then
    ``n`` per prompt); ``calls``: the tools chat outputs are parsed for (server/tools.py; None: none)."""
    choices = []
    for index, job in enumerate(jobs):
        choice: dict[str, Any] = {"index": index, "finish_reason": job.finish_reason}
        echo = job.echo_text or ""
        logprobs = None if job.logprobs is None else logprobs_body(job.logprobs, job.state.target.tokenizer, chat,
                                                                  TextOffsets(len(echo)))
        if not chat and logprobs is not None and job.echo_text is not None and job.prompt_scores is not None:
            logprobs = joined_logprobs(job.prompt_logprobs(), logprobs)
        if chat:
            choice["message"], called = answered_message(job.text, calls, job.finish_reason == "length")
            if echo:  # the continued message's text first (vLLM's chat echo)
                choice["message"]["content"] = echo + (choice["message"]["content"] or "")
            choice["logprobs"] = logprobs
            if calls is not None:
                choice["finish_reason"] = calls.finish_reason(job.finish_reason, called)
        else:
            choice.update(text=echo + job.text, logprobs=logprobs)
            if job.prompt_logprobs_asked is not None:  # vLLM's field, each choice its own prompt's
                choice["prompt_logprobs"] = job.vllm_prompt_logprobs()
        choices.append(choice)
    first = jobs[0]
    body = {"id": response_id(first.id, chat), "object": "chat.completion" if chat else "text_completion", "created": first.created,
            "model": first.state.model_name, "choices": choices, "usage": combined_usage(jobs, n)}
    if chat and first.prompt_logprobs_asked is not None:  # vLLM's place for it in chat: one conversation, one prompt
        body["prompt_logprobs"] = first.vllm_prompt_logprobs()
    return body


def combined_usage(jobs: list[Job], n: int = 1) -> dict[str, Any]:
    """OpenAI's usage of a request with several choices (``n`` per prompt): each prompt once, the
    completions' tokens summed; the speculative figures over all choices (rates from the sums)."""
    usages = [job.usage() for job in jobs]
    if len(jobs) == 1:
        return usages[0]
    choices = [dict(u["speculative"]) for u in usages]  # each choice's own figures, before the totals replace them
    completion = sum(u["completion_tokens"] for u in usages)
    prompts = usages[::n]  # each prompt's first choice
    prompt_tokens = sum(u["prompt_tokens"] for u in prompts)
    usage = usages[0]
    usage.update(prompt_tokens=prompt_tokens, completion_tokens=completion, total_tokens=prompt_tokens + completion,
                 prompt_tokens_details={"cached_tokens": sum(u["prompt_tokens_details"]["cached_tokens"] for u in prompts)})
    if "completion_tokens_details" in usage:
        usage["completion_tokens_details"] = {key: sum(u["completion_tokens_details"][key] for u in usages)
                                              for key in usage["completion_tokens_details"]}
    spec = usage["speculative"]
    for key in ("draft_tokens", "accepted_tokens", "tokens_per_s"):  # the choices ran side by side: rates add up
        spec[key] = sum(choice[key] for choice in choices)
    spec["acceptance_rate"] = round(spec["accepted_tokens"] / spec["draft_tokens"], 4) if spec["draft_tokens"] else 0.0
    weights = [u["completion_tokens"] for u in usages]  # τ per committed token, over all choices
    spec["mean_accepted_len"] = round(sum(c["mean_accepted_len"] * w for c, w in zip(choices, weights)) / max(sum(weights), 1), 4)
    spec["ttft_s"] = max(choice["ttft_s"] for choice in choices)  # the request's first tokens: its slowest choice's
    spec["choices"] = choices
    return usage


async def merged_chunks(jobs: list[Job]) -> AsyncIterator[tuple[int, Any]]:
    """``(choice index, chunk)`` from every job's :meth:`Job.chunks`, in the order they arrive; an
    error in any ends the stream with it."""
    if len(jobs) == 1:
        async for chunk in jobs[0].chunks():
            yield 0, chunk
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, job: Job) -> None:
        try:
            async for chunk in job.chunks():
                await queue.put((index, chunk))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, who re-raises it
            await queue.put((index, exc))
        finally:
            await queue.put((index, done))

    tasks = [asyncio.create_task(pump(index, job)) for index, job in enumerate(jobs)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


class Job:
    """One request's generation: set up and stepped on the model thread, consumed by the event loop."""

    def __init__(self, state: ServerState, prompt_ids: list[int], params: SamplingParams, spec: SpecConfig,
                 audit: bool = False, echo_text: str | None = None, prompt_logprobs_asked: int | None = None) -> None:
        self.state = state
        #: vLLM's ``prompt_logprobs`` of the request (None: not asked; echo's scores show under logprobs)
        self.prompt_logprobs_asked = prompt_logprobs_asked
        #: completions' ``echo``: the prompt's text, put before the output (None: not echoed)
        self.echo_text = echo_text
        #: each prompt token's log-probability, when echoed with logprobs (the first chunk brings them)
        self.prompt_scores: list[TokenLogprob | None] | None = None
        self.audit = audit  # the client asked for its own audit (else the server may sample one)
        self.audit_result: str | None = None
        self.token_ids: list[int] = []
        #: the target's log-probabilities of the emitted tokens, when the request asked for them
        self.logprobs: list[TokenLogprob] | None = None if params.logprobs is None else []
        self._offsets: TextOffsets | None = None  # a stream's completions text offsets, from its first logprobs
        self.id = f"cmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.text = ""
        self.finish_reason: str | None = None
        self.stats = None
        self.prompt_ids, self.params, self.spec = prompt_ids, params, spec
        self._cancel = threading.Event()
        #: asked before each round how much it may draft (policy.py)
        self._gate = RequestGate(state.speculation_cap,
                                 state.executor.prompt_pending if state.pause_speculation_for_prompts else None)
        #: what the model thread delivers for this request: chunks, an exception, then END (open); or
        #: the exception that kept it from opening (a stream's later choice, opened in the background)
        self._chunks: asyncio.Queue = asyncio.Queue()
        #: the background task that opens this job (a stream's choice that waited for a slot), if any
        self.opening: asyncio.Task | None = None
        #: set when the first of those arrives: the prompt pass is over (or failed)
        self.started = asyncio.Event()
        self._start = time.perf_counter()
        #: frees the concurrency slot this job holds (set by whoever acquired it); called once, when
        #: the model thread is done with it or when the job is closed, whichever comes first
        self.on_done: Callable[[], None] | None = None

    async def open(self) -> None:
        """Build the drafter (it allocates its caches: a torch op, so on the model thread) and join
        the batch in the same visit to the model thread, so the next forward can carry its prompt.
        (Joined on a second visit — once the response had started — a request arriving under load
        waited one more forward for its first token: the model thread had gone on stepping the
        others.) Errors building it are raised here: before any response is sent, except for a
        stream's choice opened in the background (:func:`open_jobs`), whose error goes into the stream."""
        loop = asyncio.get_running_loop()

        def deliver(item: Any) -> None:  # on the event loop
            self._chunks.put_nowait(item)
            self.started.set()
            if item is END:  # its slot is free for the request's further choices, or another request
                self.release()

        await self.state.executor.run(lambda: self.state.executor.add_stream(
            self._open(), lambda item: loop.call_soon_threadsafe(deliver, item), self._cancel.is_set))

    def _open(self):  # noqa: ANN202 - a generate_steps generator
        state = self.state
        draft = state.draft if needs_draft_model(self.spec.method) else None
        # this traffic's α, once measured (before that the request's controller plans optimistically)
        alpha = state.policy.measured_alpha() if self.spec.method == state.spec.method else None
        return generate_steps(**prepare(state.target, self.prompt_ids, self.params, draft, self.spec, chat=False),
                              speculate=self._gate, prefill_chunk=state.next_prefill_chunk, alpha_prior=alpha,
                              saving_under_load=state.speculation_saving)

    def cancel(self) -> None:
        self._cancel.set()
        if self.opening is not None:
            self.opening.cancel()

    def restart_clock(self) -> None:
        """Its latency counts from now (a choice built before it waited for its slot)."""
        self._start = time.perf_counter()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def fail(self, exc: BaseException) -> None:
        """It could not open: its reader raises ``exc`` (in a stream: the error event)."""
        self._chunks.put_nowait(exc)
        self.started.set()

    def release(self) -> None:
        """Free this job's concurrency slot, once."""
        done, self.on_done = self.on_done, None
        if done is not None:
            done()

    async def chunks(self) -> AsyncIterator[Any]:
        try:
            while True:
                item = await self._chunks.get()
                if item is END:
                    break
                if isinstance(item, BaseException):
                    raise item
                self.text += item.text
                self.token_ids.extend(item.token_ids)
                self.state.throughput.add_chunk(len(item.token_ids), item.rounds)  # the periodic throughput line
                if item.prompt_logprobs is not None:
                    self.prompt_scores = item.prompt_logprobs
                if self.logprobs is not None and item.logprobs:
                    self.logprobs.extend(item.logprobs)
                if item.rounds and self.spec.method == self.state.spec.method:  # the traffic's α for the γ table
                    self.state.policy.observe_rounds(item.rounds)
                if item.stats is not None:
                    self.stats, self.finish_reason = item.stats, item.finish_reason
                    self.state.metrics.observe(item.stats)
                    if item.stats.method == self.state.spec.method:  # its prompt share for the γ table
                        self.state.policy.observe_finished(item.stats)
                    self.state.metrics.latency.observe(time.perf_counter() - self._start)
                    if not self.audit and self.state.auditor is not None:
                        self.state.auditor.finished(self._audit_case())
                yield item
        finally:
            self._cancel.set()  # nobody reads on (done, client gone, task cancelled): stop stepping it
            if self.stats is None and self.token_ids:  # cut short (client gone): its tokens were still generated
                self.state.metrics.observe_cut(len(self.prompt_ids), len(self.token_ids))

    async def run_to_end(self) -> None:
        async for _ in self.chunks():
            pass

    def _audit_case(self) -> AuditCase:
        return AuditCase(self.id, self.prompt_ids, self.params, list(self.token_ids))

    async def run_audit(self) -> None:
        """The request's own audit, if it asked for one (after its last chunk, before its usage)."""
        if self.audit and self.audit_result is None and self.state.auditor is not None:
            self.audit_result = await self.state.auditor.audit_now(self._audit_case())

    def streamed_logprobs(self, scores: list[TokenLogprob], chat: bool) -> dict[str, Any]:
        """OpenAI's logprobs object for one streamed chunk's tokens, text offsets continuing the
        chunks before it (and an echoed prompt's, which come first)."""
        echoed = None
        if self._offsets is None:
            echoed = None if self.prompt_scores is None or self.echo_text is None else self.prompt_logprobs()
            self._offsets = TextOffsets(len(self.echo_text or ""))
        body = logprobs_body(scores, self.state.target.tokenizer, chat, self._offsets)
        return body if echoed is None else joined_logprobs(echoed, body)

    def prompt_logprobs(self) -> dict[str, Any]:
        """The echoed prompt's part of the completions logprobs object: each prompt token's
        log-probability after the ones before it, the first one's null (nothing precedes it)."""
        assert self.prompt_scores is not None
        return completion_logprobs(self.prompt_ids, self.prompt_scores, self.state.target.tokenizer, TextOffsets(),
                                   top=self.params.logprobs)

    def vllm_prompt_logprobs(self) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs`` of this job's prompt (the request's ``prompt_logprobs`` alternatives)."""
        assert self.prompt_scores is not None and self.prompt_logprobs_asked is not None
        return vllm_prompt_logprobs(self.prompt_scores, self.prompt_logprobs_asked, self.state.target.tokenizer)

    def usage(self) -> dict[str, Any]:
        usage = usage_body(self.stats)
        if self.params.prediction is not None:  # OpenAI's figures of a request with a prediction
            accepted, rejected = self.stats.prediction_counts or (0, 0)  # (0, 0): the method does not read it
            usage["completion_tokens_details"] = {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": rejected}
        if self.audit_result is not None:
            usage["speculative"]["audit"] = self.audit_result
        return usage


async def open_jobs(state: ServerState, choices: list[tuple[list[int], SamplingParams, str | None]], spec: SpecConfig,
                    audit: bool, prompt_logprobs: int | None = None, constraint: str | None = None,
                    stream: bool = False) -> list[Job]:
    """One job per choice (prompts x ``n``), each holding a concurrency slot from before it opens until
    it ends (a refusal or error on any releases them all); they join the batch and step side by side.
    More choices than ``--max-concurrency`` wait for the request's earlier ones to end (a queue-full
    refusal applies to the request's first choice only: the others belong to an admitted request).
    In a ``stream`` the choices that must wait open in the background once the response has started
    (waited for here, the first choice's tokens reached the client only when the last choice had a slot).

    With the prefix cache on, a prompt's further choices open once its first choice's prompt pass
    is done, so they restore its keys/values instead of each computing them: on a CPU a prompt
    pass is compute-bound and n of them in one forward cost ~n times one."""
    jobs: list[Job] = []
    try:
        for index, (prompt_ids, params, echo) in enumerate(choices):
            if jobs:
                await _after_shared_prompt(state, jobs[-1], prompt_ids, params)
            if stream and jobs and not state.slot_free():
                later = [Job(state, ids, choice, spec, audit, text, prompt_logprobs) for ids, choice, text in choices[index:]]
                task = asyncio.ensure_future(_open_in_turn(state, later, jobs[-1], constraint))
                for job in later:
                    job.opening = task
                return jobs + later
            await state.acquire_slot(admitted=bool(jobs))
            try:
                job = Job(state, prompt_ids, params, spec, audit, echo, prompt_logprobs)
            except BaseException:
                state.release_slot()
                raise
            job.on_done = state.release_slot
            jobs.append(job)  # its slot is released when it ends, or with the others' from here
            await job.open()
    except SpecdecError as exc:
        close_jobs(jobs)
        # (ours — corrupt weights, a drafter's broken contract — as the logged 500 a generation's failure is)
        raise generation_failure(request_error(exc, constraint), "new") from None
    except BaseException:
        close_jobs(jobs)
        raise
    return jobs


def request_error(exc: SpecdecError, constraint: str | None) -> Exception:
    """What a choice that cannot open is answered with: the request's fault as a 400 naming the field (a constraint
    compiled on opening: its field, ``constraint``); corrupt weights or a drafter that broke its contract are ours,
    and stay as they are for :func:`~specdec.server.errors.generation_failure`'s logged 500."""
    if isinstance(exc, (WeightsError, DrafterError)):
        return exc
    param = constraint if isinstance(exc, StructuredOutputError) else field_named(str(exc))
    return APIError(400, str(exc), param=param)


async def _after_shared_prompt(state: ServerState, previous: Job, prompt_ids: list[int], params: SamplingParams) -> None:
    """With the prefix cache on, wait for the previous choice's prompt pass when this one has the same prompt."""
    if (state.target.backend.prefix_cache is not None and previous.prompt_ids == prompt_ids
            and params.prompt_logprobs is None):
        await previous.started.wait()


async def _open_in_turn(state: ServerState, jobs: list[Job], previous: Job, constraint: str | None) -> None:
    """Open a stream's waiting choices one by one as slots free. A job that cannot open gets its error
    (its reader raises it into the stream, as the 400 a choice opened before the response would have been),
    and so do the ones after it."""
    for position, job in enumerate(jobs):
        try:
            await _after_shared_prompt(state, previous, job.prompt_ids, job.params)
            await state.acquire_slot(admitted=True)
            job.on_done = state.release_slot
            if job.cancelled:  # the stream ended while it waited
                job.release()
                return
            job.restart_clock()  # its latency from its slot, as a choice opened before the response counts it
            await job.open()
        except Exception as exc:  # noqa: BLE001 - said in the stream, where its reader is
            failure = request_error(exc, constraint) if isinstance(exc, SpecdecError) else exc
            for rest in jobs[position:]:
                rest.release()
                rest.fail(failure)
            return
        previous = job


def close_jobs(jobs: list[Job]) -> None:
    """Stop the jobs at their next step (a no-op for finished ones) and free their slots."""
    for job in jobs:
        job.cancel()
        job.release()
