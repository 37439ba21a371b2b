"""What every response carries and, when asked, one log line per request.

Every response names the process that answered (``x-specdec-instance``: replicas behind a proxy told
apart, errors and ``/health`` included — only successful generations carried it) and echoes the client's
``x-request-id`` (a trace id, as vLLM and most proxies pass it through). With ``--enable-log-requests``
(vLLM's flag) each request is one INFO line on the ``specdec.server.requests`` logger: client, method,
path, status, seconds and the request id — the only way to match a client's error to the server's log; a
request whose client left before its response ended (a cut stream too, whose 200 status line had gone out)
is logged 499, as ``/metrics`` counts it.
A pure ASGI middleware, so streamed responses pass through untouched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import time
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("specdec.server.requests")
#: the status logged for a request whose client left before its response ended (nginx's; /metrics counts it so)
CLIENT_GONE = 499


class ResponseHeaders:
    """Adds ``x-specdec-instance`` (and, where ``echo_request_id``, the request's ``x-request-id``) to every HTTP
    response; logs one line per request where ``log_requests``."""

    def __init__(self, app: ASGIApp, instance: str, log_requests: bool = False, echo_request_id: bool = True) -> None:
        self.app, self.instance, self.log_requests = app, instance.encode("latin-1"), log_requests
        self.echo_request_id = echo_request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = next((value for name, value in scope.get("headers", []) if name.lower() == b"x-request-id"), None)
        start, status = time.perf_counter(), 0
        completed = cut = False  # the response's last byte went out / the client left before it

        async def send_with_headers(message: Message) -> None:
            nonlocal status, completed
            if message["type"] == "http.response.start":
                status = message["status"]
                extra = [(b"x-specdec-instance", self.instance)]
                if request_id is not None and self.echo_request_id:
                    extra.append((b"x-request-id", request_id[:200]))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True
            await send(message)

        async def watched_receive() -> Message:
            nonlocal cut
            message = await receive()
            cut = cut or (message["type"] == "http.disconnect" and not completed)
            return message

        try:
            await self.app(scope, receive if not self.log_requests else watched_receive, send_with_headers)
        except (ClientDisconnect, asyncio.CancelledError):  # (ASGI 2.4 servers: a failed send, not a disconnect message)
            cut = True
            raise
        finally:
            if self.log_requests:
                # a stream its client cut had sent its 200 status line: logged 499, as /metrics counts it
                shown = CLIENT_GONE if cut and not completed else status
                log.info("%s", access_line(scope, shown, time.perf_counter() - start, request_id))


def content_line(request_id: str | None, endpoint: str, prompts: list[tuple[str, int]], n: int, params: Any,
                 speculation: str, max_chars: int | None) -> str:
    """What a generation request asked for, logged when it is admitted (vLLM's "Received request" line):
    ``request_id=abc chat: '<|im_start|>system…' (35 tokens) temperature=0.7 max_tokens=64 n=2; draft_suffix γ=auto``.
    ``prompts``: each prompt's text and token count, the text cut to ``max_chars`` characters (``--max-log-len``;
    None: whole, 0: left out). The status line at the end (:func:`access_line`) alone did not say what a failing
    request held."""
    shown = []
    for text, tokens in prompts:
        count = f"{tokens} token{'s' if tokens != 1 else ''}"
        if max_chars == 0:
            shown.append(f"({count})")
        elif max_chars is None or len(text) <= max_chars:
            shown.append(f"{text!r} ({count})")
        else:
            shown.append(f"{text[:max_chars]!r}…(+{len(text) - max_chars} characters; {count})")
    head = f"request_id={request_id[:200]} {endpoint}:" if request_id else f"{endpoint}:"
    return " ".join([head, *shown, changed_fields(params, max_chars), f"n={n};", speculation])


def log_content(state: Any, request_id: str | None, endpoint: str, prompt_ids: list[list[int]], n: int, params: Any,
                spec: Any) -> None:
    """:func:`content_line` on the request log (``state``: the ServerState; ``spec``: the request's SpecConfig), each
    prompt decoded with its special tokens (what the model reads)."""
    decode = state.target.tokenizer.decode
    prompts = [(decode(ids, skip_special_tokens=False) if state.max_log_len != 0 else "", len(ids)) for ids in prompt_ids]
    speculation = f"{spec.method} γ={spec.num_speculative_tokens}" if spec.method else "plain decoding"
    log.info("%s", content_line(request_id, endpoint, prompts, n, params, speculation, state.max_log_len))


#: characters of a sampling parameter's value the request log shows (a JSON schema, a list of stop ids can be long)
FIELD_CHARS = 200
#: sampling parameters that hold the user's text, cut to --max-log-len as the prompt is
TEXT_FIELDS = ("stop", "structured", "prediction")


def changed_fields(params: Any, max_chars: int | None) -> str:
    """A dataclass's fields that differ from their defaults, ``name=value`` (a SamplingParams' repr is ~30 fields),
    each value cut to FIELD_CHARS characters, those holding the user's text (TEXT_FIELDS) to ``max_chars`` too
    (None: FIELD_CHARS only; 0: the name alone)."""
    default = type(params)()
    shown = []
    for field in dataclasses.fields(params):
        value = getattr(params, field.name)
        if not field.repr or value == getattr(default, field.name):
            continue
        text, limit = repr(value), FIELD_CHARS
        if field.name in TEXT_FIELDS and max_chars is not None:
            limit = min(limit, max_chars)
        shown.append(f"{field.name}={text[:limit]}{'…' if len(text) > limit else ''}")
    return " ".join(shown)


def access_line(scope: Scope, status: int, seconds: float, request_id: bytes | None) -> str:
    """``127.0.0.1:51234 "POST /v1/completions" 200 1.234 s request_id=abc`` (status 0: no response was sent)."""
    client: Any = scope.get("client") or ("-", 0)
    line = f'{client[0]}:{client[1]} "{scope.get("method", "")} {scope.get("path", "")}" {status} {seconds:.3f} s'
    if request_id is not None:
        line += f" request_id={request_id[:200].decode('latin-1')}"
    return line


def log_info_to_stderr(name: str) -> None:
    """Let logger ``name`` print INFO lines on stderr (--enable-log-requests, the throughput line); in a Ray replica,
    which has no handler above it (Python's last resort drops INFO), through a handler of its own."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
