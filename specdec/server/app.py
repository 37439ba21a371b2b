"""OpenAI-compatible HTTP server: completions and chat completions (streamed or not), models,
health and Prometheus metrics, with bounded concurrency and per-request speculative stats.

Each request gets its own KV cache and drafter state (the suffix drafter's global cache is shared on
purpose). Everything that touches torch runs on one model thread that steps the active requests in
turn (server/executor.py says why); a client that disconnects mid-stream is dropped before its
next step and frees its slot. Bad input gets an OpenAI-style error object and the server stays up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specdec.api import LoadedModel, encode_prompt, prepare
from specdec.config import SpecConfig
from specdec.drafters.registry import method_info, needs_draft_model, resolve_method
from specdec.engine import check_context, generate_steps
from specdec.errors import ContextLengthError, SpecdecError
from specdec.forward_costs import Forward
from specdec.sampling import SamplingParams, TokenLogprob
from specdec.server.audit import AuditCase, Auditor, auditable
from specdec.server.executor import END, ModelExecutor
from specdec.server.metrics import Metrics
from specdec.server.params import APIError, sampling_params
from specdec.policy import BatchPolicy, LoadAverage, RequestGate, requests_now
from specdec.server.schemas import ChatCompletionRequest, CompletionRequest, error_body
from specdec.server.responses import logprobs_body, sse, usage_body
from specdec.server.security import AccessMiddleware, AccessPolicy

@dataclass
class ServerState:
    target: LoadedModel
    model_name: str
    draft: LoadedModel | None = None
    spec: SpecConfig = field(default_factory=SpecConfig)
    max_concurrency: int = 8
    max_queue: int = 64
    #: how much requests may draft at the server's load (policy.py: --disable-speculation-above)
    policy: BatchPolicy = field(default_factory=BatchPolicy)
    #: chunked prefill: prompt tokens per target call (0: whole prompts; engine.generate_steps)
    prefill_chunk: int = 0
    #: running requests draft nothing while a new one waits for its prompt pass (Batcher.prompt_pending)
    pause_speculation_for_prompts: bool = True
    #: request limits (None: only the context window bounds them): prompt tokens, max_tokens
    max_prompt_tokens: int | None = None
    max_tokens_limit: int | None = None
    #: API keys and the body size limit, enforced before routing (server/security.py)
    access: AccessPolicy = field(default_factory=AccessPolicy)
    #: fraction of finished greedy requests re-decoded plainly when idle (server/audit.py)
    audit_fraction: float = 0.0
    auditor: Auditor | None = None  # made by create_app
    metrics: Metrics = field(default_factory=Metrics)
    active: int = 0
    waiting: int = 0
    #: recent active + waiting requests, what --disable-speculation-above is read against (policy.py)
    load: LoadAverage = field(default_factory=LoadAverage)
    slots: asyncio.Semaphore | None = None
    #: the thread that loaded the models and runs every step (see server/executor.py)
    executor: ModelExecutor = field(default_factory=ModelExecutor)
    #: which process answered (header ``x-specdec-instance``, /health): tells replicas apart behind a proxy
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    def speculation_cap(self) -> int | None:
        """The most tokens a request may draft now (0: none; None: no cap): policy.py, read against
        the larger of the requests active now and the recent average."""
        return self.policy.cap(requests_now(self.active, self.load))

    def speculation_saving(self) -> float | None:
        """Seconds per token speculating saves at the current load (BatchPolicy.saving)."""
        return self.policy.saving(requests_now(self.active, self.load))

    def reset_prefix_caches(self) -> int | None:
        """Empty the target's and the draft model's prefix caches (run it on the model thread);
        the blocks dropped, or None where no model has one."""
        caches = [model.backend.prefix_cache for model in (self.target, self.draft)
                  if model is not None and model.backend.prefix_cache is not None]
        return sum(cache.reset() for cache in caches) if caches else None

    def count_requests(self) -> None:
        """After ``active`` or ``waiting`` moved: the gauges and the load average."""
        self.metrics.active.set(self.active)
        self.metrics.waiting.set(self.waiting)
        self.load.set(self.active + self.waiting)


def _request_spec(state: ServerState, req: CompletionRequest | ChatCompletionRequest, raw: dict) -> SpecConfig:
    """The server's configuration with the request's override on top: every server flag
    (``--draft-vocab-size``, ``--skip-layers`` …) applies per request unless the request changes it;
    ``"speculative": null`` asks for plain decoding."""
    if "speculative" in raw and raw["speculative"] is None:
        return SpecConfig()
    override = req.speculative
    changes: dict[str, Any] = {}
    try:
        if override is not None and override.method:
            changes["method"] = resolve_method(override.method)
        if override is not None and override.num_speculative_tokens is not None:
            changes["num_speculative_tokens"] = override.num_speculative_tokens
        spec = dataclasses.replace(state.spec, **changes)  # __post_init__ validates the result
    except SpecdecError as exc:
        raise APIError(400, str(exc), param="speculative") from None
    if spec.method is not None and method_info(spec.method).needs_draft_model and state.draft is None:
        raise APIError(400, f"method {spec.method!r} is not available: the server was started without --draft-model",
                       param="speculative")
    if spec.method is not None and "drafter_path" in method_info(spec.method).options and not spec.drafter_path:
        raise APIError(400, f"method {spec.method!r} is not available: the server was started without --drafter-path",
                       param="speculative")
    if spec.method == "retrieval" and not spec.datastore:
        raise APIError(400, "method 'retrieval' is not available: the server was started without --datastore",
                       param="speculative")
    return spec


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="specdec", description="OpenAI-compatible server with lossless speculative decoding")
    app.state.specdec = state

    def heard(forward: Forward) -> None:  # on the model thread, after each forward
        state.metrics.observe_forward(forward)
        state.policy.costs.observe(forward)  # what forwards cost at this load: the policy's γ table reads it

    state.executor.enable_batching(on_forward=heard)
    state.metrics.traffic_acceptance.set_function(lambda: state.policy.acceptance.alpha)
    state.auditor = Auditor(state.target, state.executor, state.metrics, state.audit_fraction,
                            busy=lambda: state.active > 0 or state.waiting > 0)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        state.metrics.requests.labels("any", str(exc.status)).inc()
        return JSONResponse(error_body(exc.message, exc.kind, exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", []) if p != "body")
        return JSONResponse(error_body(f"invalid request: {where}: {first.get('msg', 'malformed')}", param=where or None), status_code=400)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "active": state.active, "waiting": state.waiting, "instance": state.instance}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> JSONResponse:
        """vLLM's endpoint: forget every cached prompt block (requests in flight keep what they
        restored). 400 where prefix caching is off."""
        dropped = await state.executor.run(state.reset_prefix_caches)
        if dropped is None:
            return JSONResponse(error_body("prefix caching is off on this server", code="prefix_caching_disabled"),
                                status_code=400)
        return JSONResponse({"object": "prefix_cache.reset", "blocks_dropped": dropped})

    @app.post("/reset_suffix_cache")
    async def reset_suffix_cache() -> JSONResponse:
        """Forget the earlier requests' outputs suffix decoding drafts from (drafters/suffix.py;
        requests in flight keep theirs): a benchmark sending the same prompts twice would otherwise
        have the second pass drafted from the first pass's answers."""
        from specdec.drafters.suffix import clear_global_caches

        await state.executor.run(clear_global_caches)
        return JSONResponse({"object": "suffix_cache.reset"})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0, "owned_by": "specdec"}]}

    async def parse(request: Request, schema: type) -> tuple[Any, dict]:
        try:
            raw = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError(400, "malformed JSON body") from None
        if not isinstance(raw, dict):
            raise APIError(400, "the JSON body must be an object")
        try:
            req = schema.model_validate(raw)
        except Exception as exc:  # pydantic.ValidationError
            errors = getattr(exc, "errors", lambda: [])()
            first = errors[0] if errors else {}
            where = ".".join(str(p) for p in first.get("loc", []))
            raise APIError(400, f"invalid request: {where}: {first.get('msg', str(exc))}", param=where or None) from None
        if req.model is not None and req.model != state.model_name:
            raise APIError(404, f"model {req.model!r} not found; this server serves {state.model_name!r}", code="model_not_found", param="model")
        return req, raw

    async def handle(request: Request, chat: bool) -> Response:
        req, raw = await parse(request, ChatCompletionRequest if chat else CompletionRequest)
        try:
            prompt = [m.model_dump() for m in req.messages] if chat else req.prompt
            if chat and not prompt:
                raise APIError(400, "messages must not be empty", param="messages")
            prompt_ids = encode_prompt(state.target, prompt, chat=False)
        except SpecdecError as exc:
            raise APIError(400, str(exc)) from None
        if state.max_prompt_tokens is not None and len(prompt_ids) > state.max_prompt_tokens:
            raise APIError(400, f"the prompt has {len(prompt_ids)} tokens; this server's limit is {state.max_prompt_tokens} "
                                "(--max-prompt-tokens)", param="prompt", code="context_length_exceeded")
        context_len = state.target.config.max_position_embeddings
        params = sampling_params(req, context_len, len(prompt_ids), state.max_tokens_limit)
        try:
            check_context(len(prompt_ids), params.max_tokens, context_len)
        except (ContextLengthError, SpecdecError) as exc:
            raise APIError(400, str(exc), code="context_length_exceeded") from None
        spec = _request_spec(state, req, raw)
        audit = req.speculative is not None and req.speculative.audit
        if audit and not auditable(params):
            raise APIError(400, "an audit compares token ids with plain decoding: it needs temperature 0", param="speculative")
        await acquire_slot()
        endpoint = "chat" if chat else "completions"
        job = Job(state, prompt_ids, params, spec, audit)
        try:
            await job.open()
        except SpecdecError as exc:
            release_slot()
            raise APIError(400, str(exc)) from None
        except BaseException:
            release_slot()
            raise
        if req.stream:
            return StreamingResponse(stream_events(job, chat, endpoint), media_type="text/event-stream",
                                     headers={"x-specdec-instance": state.instance})
        try:
            await job.run_to_end()
            await job.run_audit()
        except SpecdecError as exc:
            raise APIError(400, str(exc)) from None
        finally:
            release_slot()
        state.metrics.requests.labels(endpoint, "200").inc()
        return JSONResponse(full_response(job, chat), headers={"x-specdec-instance": state.instance})

    async def acquire_slot() -> None:
        if state.slots is None:
            state.slots = asyncio.Semaphore(state.max_concurrency)
        if state.slots.locked() and state.waiting >= state.max_queue:
            raise APIError(429, "server busy: the request queue is full, retry later", kind="rate_limit_error", code="queue_full")
        state.waiting += 1
        state.count_requests()
        try:
            await state.slots.acquire()
        finally:
            state.waiting -= 1
            state.count_requests()
        state.active += 1
        state.count_requests()

    def release_slot() -> None:
        state.active -= 1
        state.count_requests()
        assert state.slots is not None
        state.slots.release()

    async def stream_events(job: "Job", chat: bool, endpoint: str) -> AsyncIterator[str]:
        try:
            if chat:
                yield sse(chunk_body(job, chat, {"role": "assistant", "content": ""}, None))
            async for chunk in job.chunks():
                if chunk.text or chunk.finish_reason or chunk.logprobs:
                    delta = {"content": chunk.text} if chat else chunk.text
                    body = chunk_body(job, chat, delta, chunk.finish_reason)
                    if chunk.logprobs is not None:
                        body["choices"][0]["logprobs"] = job.streamed_logprobs(chunk.logprobs, chat)
                    if chunk.stats is not None:
                        await job.run_audit()
                        body["usage"] = job.usage()
                    yield sse(body)
            yield "data: [DONE]\n\n"
            state.metrics.requests.labels(endpoint, "200").inc()
        finally:
            job.cancel()  # client gone or done: stop generating at the next step
            release_slot()

    app.state.handle = handle
    reasons = {401: "invalid_api_key", 413: "body_too_large"}
    app.add_middleware(AccessMiddleware, policy=state.access,
                       on_refused=lambda status: state.metrics.refused.labels(reasons[status]).inc())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    return app


def chunk_body(job: "Job", chat: bool, delta: Any, finish_reason: str | None) -> dict[str, Any]:
    choice = {"index": 0, "finish_reason": finish_reason}
    choice.update({"delta": delta} if chat else {"text": delta, "logprobs": None})
    return {"id": job.id, "object": "chat.completion.chunk" if chat else "text_completion", "created": job.created,
            "model": job.state.model_name, "choices": [choice]}


def full_response(job: "Job", chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": job.finish_reason}
    logprobs = None if job.logprobs is None else logprobs_body(job.logprobs, job.state.target.tokenizer.decode, chat)
    if chat:
        choice["message"] = {"role": "assistant", "content": job.text}
        choice["logprobs"] = logprobs
    else:
        choice.update(text=job.text, logprobs=logprobs)
    return {"id": job.id, "object": "chat.completion" if chat else "text_completion", "created": job.created,
            "model": job.state.model_name, "choices": [choice], "usage": job.usage()}


class Job:
    """One request's generation: set up and stepped on the model thread, consumed by the event loop."""

    def __init__(self, state: ServerState, prompt_ids: list[int], params: SamplingParams, spec: SpecConfig,
                 audit: bool = False) -> None:
        self.state = state
        self.audit = audit  # the client asked for its own audit (else the server may sample one)
        self.audit_result: str | None = None
        self.token_ids: list[int] = []
        #: the target's log-probabilities of the emitted tokens, when the request asked for them
        self.logprobs: list[TokenLogprob] | None = None if params.logprobs is None else []
        self._logprob_chars = 0  # characters of token text already given offsets (completions)
        self.id = f"cmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.text = ""
        self.finish_reason: str | None = None
        self.stats = None
        self.prompt_ids, self.params, self.spec = prompt_ids, params, spec
        self._cancel = threading.Event()
        #: asked before each round how much it may draft (policy.py)
        self._gate = RequestGate.unless_seeded(params, state.speculation_cap,
                                               state.executor.prompt_pending if state.pause_speculation_for_prompts else None)
        #: what the model thread delivers for this request: chunks, an exception, then END (open)
        self._chunks: asyncio.Queue | None = None
        self._start = time.perf_counter()

    async def open(self) -> None:
        """Build the drafter (it allocates its caches: a torch op, so on the model thread) and join
        the batch in the same visit to the model thread, so the next forward can carry its prompt.
        (Joined on a second visit — once the response had started — a request arriving under load
        waited one more forward for its first token: the model thread had gone on stepping the
        others.) Errors building it are raised here, before any response is sent."""
        loop = asyncio.get_running_loop()
        self._chunks = asyncio.Queue()
        await self.state.executor.run(lambda: self.state.executor.add_stream(
            self._open(), lambda item: loop.call_soon_threadsafe(self._chunks.put_nowait, item), self._cancel.is_set))

    def _open(self):  # noqa: ANN202 - a generate_steps generator
        state = self.state
        draft = state.draft if needs_draft_model(self.spec.method) else None
        # this traffic's α, once measured (before that the request's controller plans optimistically)
        alpha = state.policy.measured_alpha() if self.spec.method == state.spec.method else None
        return generate_steps(**prepare(state.target, self.prompt_ids, self.params, draft, self.spec, chat=False),
                              speculate=self._gate, prefill_chunk=state.prefill_chunk, alpha_prior=alpha,
                              saving_under_load=state.speculation_saving)

    def cancel(self) -> None:
        self._cancel.set()

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
        chunks before it."""
        body = logprobs_body(scores, self.state.target.tokenizer.decode, chat, self._logprob_chars)
        if not chat:
            self._logprob_chars += sum(len(t) for t in body["tokens"])
        return body

    def usage(self) -> dict[str, Any]:
        usage = usage_body(self.stats)
        if self.audit_result is not None:
            usage["speculative"]["audit"] = self.audit_result
        return usage
