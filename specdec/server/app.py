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
import logging
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specdec.api import encode_prompt
from specdec.config import SpecConfig
from specdec.drafters.registry import method_info, resolve_method
from specdec.errors import SpecdecError
from specdec.forward_costs import Forward
from specdec.server.audit import Auditor, auditable
from specdec.server.errors import generation_failure, install_error_handlers
from specdec.server.jobs import Job, chunk_body, close_jobs, combined_usage, full_response, merged_chunks, open_jobs
from specdec.server.state import ServerState
from specdec.server.stats_log import stats_lifespan
from specdec.server.params import APIError, constraint_field
from specdec.server.prompts import request_choices
from specdec.server.tools import RequestTools, ToolTextFilter, chat_prompt, streamed_delta
from specdec.server.schemas import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest,
                                    document_request_bodies, error_body, lone_surrogate_at, validation_message)
from specdec.server.request_log import ResponseHeaders, log_content
from specdec.server.responses import sse
from specdec.server.security import AccessMiddleware, add_cors

logger = logging.getLogger("specdec.server")


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


#: how often a non-streamed request checks that its client is still there
DISCONNECT_POLL_S = 0.25


async def finished_unless_gone(request: Request, work: "asyncio.Future[Any]") -> bool:
    """Await ``work`` (a request's generations), or cancel it once the client has disconnected: False.
    Why: a streamed response notices a gone client at its next write, a non-streamed one only at the
    end — a client that timed out kept the model (and a concurrency slot) busy for the rest of its
    generation, minutes for a long one. Cancelling stops its jobs' stepping (Job.chunks)."""
    async def gone() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not work.done():
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return False
    work.result()  # its exception, if it failed
    return True


#: chat fields of OpenAI's deprecated function calling (before tools): refused by name rather than ignored
LEGACY_FUNCTION_FIELDS = ("functions", "function_call")


def create_app(state: ServerState) -> FastAPI:
    # the periodic throughput line while the app serves, where asked for (server/stats_log.py)
    lifespan = stats_lifespan(state.throughput, state.stats_interval_s, lambda: (state.active, state.waiting))
    app = FastAPI(title="specdec", description="OpenAI-compatible server with lossless speculative decoding",
                  lifespan=lifespan)
    app.state.specdec = state

    def heard(forward: Forward) -> None:  # on the model thread, after each forward
        state.metrics.observe_forward(forward)
        state.throughput.add_forward(forward)
        state.policy.costs.observe(forward)  # what forwards cost at this load: the policy's γ table reads it

    state.executor.enable_batching(on_forward=heard)
    state.metrics.traffic_acceptance.set_function(lambda: state.policy.acceptance.alpha)
    state.metrics.watch_prefix_caches({role: model.backend.prefix_cache for role, model in (("target", state.target), ("draft", state.draft))
                                       if model is not None and model.backend.prefix_cache is not None})
    state.auditor = Auditor(state.target, state.executor, state.metrics, state.audit_fraction,
                            busy=lambda: state.active > 0 or state.waiting > 0)

    install_error_handlers(app, state.metrics)

    @app.api_route("/ping", methods=["GET", "POST"])  # vLLM's (SageMaker's health route)
    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: what some load balancers probe with (was a 405)
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

    def model_card() -> dict[str, Any]:
        """OpenAI's model object, with vLLM's ``max_model_len`` (the context window: prompt + output)."""
        return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "specdec",
                "max_model_len": state.target.config.max_position_embeddings}

    @app.get("/version")
    async def version() -> dict[str, str]:
        """vLLM's route: the server's version."""
        from specdec import __version__

        return {"version": __version__}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        """OpenAI's retrieve: the served model's card, or a 404 naming the ones served."""
        if model != state.model_name:
            raise APIError(404, f"model {model!r} not found; this server serves {state.model_name!r}", param="model",
                           code="model_not_found")
        return model_card()

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        """vLLM's route: the token ids this server would read for a text prompt or chat messages."""
        req, _ = await parse(request, TokenizeRequest)
        tokenizer = state.target.tokenizer
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give prompt (text) or messages, not both", param="prompt")
        if req.prompt is not None:
            ids = tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:  # what the chat endpoint reads (its checked_prompt)
            prompt, _ = chat_prompt(tokenizer, ChatCompletionRequest(messages=req.messages, tools=req.tools))
            try:
                ids = encode_prompt(state.target, prompt)
            except SpecdecError as exc:
                raise APIError(400, str(exc), param="messages") from None
        return {"count": len(ids), "max_model_len": state.target.config.max_position_embeddings, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        """vLLM's route: the text of token ids (special tokens kept)."""
        req, _ = await parse(request, DetokenizeRequest)
        vocab = state.target.config.vocab_size
        outside = [token for token in req.tokens if not 0 <= token < vocab]
        if outside:
            raise APIError(400, f"tokens must be in 0..{vocab - 1}; got {outside[:5]}", param="tokens")
        return {"prompt": state.target.tokenizer.decode(req.tokens, skip_special_tokens=False)}

    async def parse(request: Request, schema: type) -> tuple[Any, dict]:
        try:
            raw = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError(400, "malformed JSON body") from None
        except RecursionError:  # 5 000 nested brackets: a 500 and a reset connection
            raise APIError(400, "malformed JSON body: nested too deeply") from None
        if not isinstance(raw, dict):
            raise APIError(400, "the JSON body must be an object")
        broken = lone_surrogate_at(raw)
        if broken:
            raise APIError(400, f"invalid request: {broken}: a string with a lone surrogate escape (\\ud800-\\udfff "
                                "unpaired) is not Unicode text", param=broken)
        try:
            req = schema.model_validate(raw)
        except Exception as exc:  # pydantic.ValidationError
            errors = getattr(exc, "errors", lambda: [])()
            message, where = validation_message(errors) if errors else (f"invalid request: {exc}", None)
            raise APIError(400, message, param=where) from None
        known = {field.alias or name for name, field in schema.model_fields.items()} | set(schema.model_fields)
        legacy = [name for name in LEGACY_FUNCTION_FIELDS  # (null, [] or "none" ask for no function calling: ignored)
                  if raw.get(name) not in (None, [], "none") and schema is ChatCompletionRequest]
        if legacy:  # ignored, the model answered in prose where the client waited for a function_call
            raise APIError(400, f"{legacy[0]}: OpenAI's deprecated form of tool calling is not served: send the functions "
                                "as tools ([{\"type\": \"function\", \"function\": …}]) and function_call as tool_choice",
                           param=legacy[0])
        ignored = sorted(set(raw) - known)
        if ignored:  # as vLLM does: accepted (clients send other servers' extensions) but said
            logger.warning("request fields not read by this server, ignored: %s", ", ".join(ignored))
        if req.model is not None and req.model != state.model_name:
            raise APIError(404, f"model {req.model!r} not found; this server serves {state.model_name!r}", code="model_not_found", param="model")
        return req, raw

    async def handle(request: Request, chat: bool) -> Response:
        req, raw = await parse(request, ChatCompletionRequest if chat else CompletionRequest)
        # tokenizing off the event loop: a 3 MB prompt held it for 2 s (health checks and other streams waited)
        choices, calls, params = await asyncio.to_thread(request_choices, state, req, chat)
        spec = _request_spec(state, req, raw)
        audit = req.speculative is not None and req.speculative.audit
        if audit and not auditable(params):
            raise APIError(400, "an audit compares token ids with plain decoding: it needs temperature 0", param="speculative")
        endpoint = "chat" if chat else "completions"
        if state.log_requests:  # what it asked for, on admission (the status line at its end said too little)
            await asyncio.to_thread(log_content, state, request.headers.get("x-request-id"), endpoint,
                                    [ids for ids, _, _ in choices[::req.n]], req.n, params, spec)
        # a client that gives up while queued leaves the queue now (it held a place, and queue-full refusals
        # were answered to clients behind it, until a slot freed and its request was found gone)
        opening = asyncio.ensure_future(open_jobs(state, choices, spec, audit, req.prompt_logprobs, constraint_field(req),
                                                  stream=bool(req.stream)))
        if not await finished_unless_gone(request, opening):
            state.metrics.requests.labels(endpoint, "499").inc()
            return Response(status_code=499)
        jobs = opening.result()
        if req.stream:
            options = req.stream_options
            # usage: OpenAI's one last chunk with include_usage; each choice's last chunk without stream_options
            # (specdec's, with the speculative statistics); none with include_usage false, as asked
            usage = "total" if options is not None and options.include_usage else "choice" if options is None else None
            # close_jobs also after the response: a client gone before the stream's first read never ran its
            # generator's finally, and its jobs (and a stream's choices waiting for slots) ran for nobody. An async
            # function, so it runs on the event loop (a plain one runs in a worker thread: slots are the loop's)
            async def close_after() -> None:
                close_jobs(jobs)

            return StreamingResponse(stream_events(jobs, chat, endpoint, req.n, usage, calls), media_type="text/event-stream",
                                     background=BackgroundTask(close_after))
        try:
            if not await finished_unless_gone(request, asyncio.gather(*(job.run_to_end() for job in jobs))):
                state.metrics.requests.labels(endpoint, "499").inc()  # nginx's "client closed request"
                return Response(status_code=499)
            await asyncio.gather(*(job.run_audit() for job in jobs))
        except Exception as exc:  # noqa: BLE001 - answered here, where the connection stays usable (an exception
            # left to Starlette's last-resort handler is re-raised after its response, and uvicorn then closes
            # the connection: a client's next request on it was reset)
            raise generation_failure(exc, endpoint) from None
        finally:
            close_jobs(jobs)
        state.metrics.requests.labels(endpoint, "200").inc()
        return JSONResponse(full_response(jobs, chat, req.n, calls))

    async def stream_events(jobs: list[Job], chat: bool, endpoint: str, n: int, usage: str | None,
                            calls: RequestTools | None = None) -> AsyncIterator[str]:
        """The choices' chunks as they come (each names its choice's index). ``usage`` "choice": a choice's
        last chunk carries its usage; "total" (``stream_options.include_usage``): one more chunk (no choices)
        carries the whole request's, as OpenAI sends it; None: no usage. With tools (``calls``) text that may
        be a call is held back and the calls go out whole in the last chunk (server/tools.py)."""
        try:
            if chat:
                for index, job in enumerate(jobs):
                    yield sse(chunk_body(job, chat, {"role": "assistant", "content": ""}, None, index, jobs[0].id))
            unechoed = {index for index, job in enumerate(jobs) if job.echo_text}
            filters = [ToolTextFilter(calls.names, calls.parallel) for _ in jobs] if calls is not None else None
            async for index, chunk in merged_chunks(jobs):
                job = jobs[index]
                echo = job.echo_text if index in unechoed else ""
                unechoed.discard(index)
                finish_reason = chunk.finish_reason
                delta: Any = {"content": echo + chunk.text} if chat else echo + chunk.text
                if filters is not None:
                    delta = streamed_delta(filters[index], chunk.text, job.text if finish_reason else None,
                                           finish_reason == "length")
                    finish_reason = calls.finish_reason(finish_reason, "tool_calls" in delta)
                    if echo:
                        delta = {**delta, "content": echo + delta.get("content", "")}
                held_back = filters is not None and delta == {"content": ""}  # text that may be a call: nothing to send
                if echo or (chunk.text and not held_back) or chunk.finish_reason or chunk.logprobs:
                    body = chunk_body(job, chat, delta, finish_reason, index, jobs[0].id)
                    if chunk.logprobs is not None:
                        body["choices"][0]["logprobs"] = job.streamed_logprobs(chunk.logprobs, chat)
                    if chunk.stats is not None:
                        await job.run_audit()
                        if usage == "choice":  # not beside OpenAI's final chunk: a client summing chunks counted it twice
                            body["usage"] = job.usage()
                    yield sse(body)
            if usage == "total":
                last = chunk_body(jobs[0], chat, None, None, 0, jobs[0].id)
                yield sse({**last, "choices": [], "usage": combined_usage(jobs, n)})
            yield "data: [DONE]\n\n"
            state.metrics.requests.labels(endpoint, "200").inc()
        except Exception as exc:  # noqa: BLE001 - the status line is sent: the error goes in the stream
            # as OpenAI and vLLM send it (the openai SDK raises it as APIError), then [DONE], so a client
            # does not read a cut stream as a finished answer
            failure = generation_failure(exc, endpoint)
            yield sse(failure.body())
            yield "data: [DONE]\n\n"
            state.metrics.requests.labels(endpoint, str(failure.status)).inc()
        except (asyncio.CancelledError, GeneratorExit):  # the client left mid-stream: counted as a non-streamed one is
            state.metrics.requests.labels(endpoint, "499").inc()
            raise
        finally:
            close_jobs(jobs)  # client gone or done: stop generating at the next step

    app.state.handle = handle
    reasons = {401: "invalid_api_key", 413: "body_too_large"}
    app.add_middleware(AccessMiddleware, policy=state.access,
                       on_refused=lambda status: state.metrics.refused.labels(reasons[status]).inc())
    # outermost: refusals (401, 413) carry the instance header and are logged too
    app.add_middleware(ResponseHeaders, instance=state.instance, log_requests=state.log_requests,
                       echo_request_id=state.echo_request_id)
    add_cors(app, state.cors)  # outermost of all: preflights never meet the key check

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    document_request_bodies(app)

    return app
