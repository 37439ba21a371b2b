"""Access control and request limits for ``specdec serve``, applied before any route runs.

Why an ASGI middleware rather than FastAPI dependencies: a dependency runs after the body has been
received and (for our routes) parsed, so neither a missing key nor a 1 GB body would be refused
before the server had paid for it. Here the key is checked from the headers alone, and the body is
read at most ``max_body_bytes + 1`` bytes into memory before a 413 — a client cannot make the
server hold more than that, whatever it sends or claims in ``Content-Length``.

Keys: ``--api-key`` (repeatable), ``--api-key-file`` (one per line, ``#`` comments) and the
``SPECDEC_API_KEY`` environment variable, as vLLM and llama-server name them. Every ``/v1/`` route
needs ``Authorization: Bearer <key>``; ``/health`` stays open (load balancers probe it) and
``/metrics`` is open unless ``metrics_require_key``. Keys are compared in constant time
(:func:`hmac.compare_digest`, against every configured key) and never echoed in errors or logs.
"""

from __future__ import annotations

import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from specdec.errors import SpecdecError

#: the body size limit when none is given: chat requests with long contexts stay far below it
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
API_KEY_ENV = "SPECDEC_API_KEY"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def load_api_keys(keys: list[str] | None, key_file: str | None, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Every configured key: the flags', the file's (one per line; blank lines and ``#`` comments
    skipped) and ``$SPECDEC_API_KEY``'s. A missing or unreadable file, or an empty key, is an error:
    a server the user meant to protect must not start open."""
    environ = os.environ if environ is None else environ
    found = [k.strip() for k in keys or []]
    if key_file is not None:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise SpecdecError(f"--api-key-file {key_file}: cannot read it ({exc.strerror or exc})") from None
        except UnicodeDecodeError:
            raise SpecdecError(f"--api-key-file {key_file}: not UTF-8 text (one key per line)") from None
        file_keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not file_keys:
            raise SpecdecError(f"--api-key-file {key_file} holds no key (one per line; '#' starts a comment)")
        found += file_keys
    if environ.get(API_KEY_ENV):
        found.append(environ[API_KEY_ENV].strip())
    if any(not key for key in found):
        raise SpecdecError("an API key must not be empty")
    return tuple(dict.fromkeys(found))


#: endpoints outside /v1/ behind the API key like it: those that change the server's state, and
#: vLLM's tokenizer routes (they read the request's text)
ADMIN_PATHS = ("/reset_prefix_cache", "/reset_suffix_cache", "/tokenize", "/detokenize")


@dataclass(frozen=True)
class AccessPolicy:
    """What the middleware enforces. No keys: the server is open (its default bind is 127.0.0.1)."""

    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    metrics_require_key: bool = False

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            raise SpecdecError(f"--max-body-bytes must be positive, got {self.max_body_bytes}")

    def needs_key(self, path: str) -> bool:
        if not self.api_keys:
            return False
        return (path.startswith("/v1/") or path == "/v1" or path in ADMIN_PATHS
                or (self.metrics_require_key and path.startswith("/metrics")))

    def key_matches(self, authorization: str | None) -> bool:
        """Constant time in the key's content: every configured key is compared, whatever matched."""
        scheme, _, token = (authorization or "").partition(" ")
        given = token.strip().encode() if scheme.lower() == "bearer" else b""
        matched = False
        for key in self.api_keys:
            matched |= hmac.compare_digest(given, key.encode())
        return matched and bool(given)


@dataclass(frozen=True)
class CorsPolicy:
    """Which browser pages may call the server (CORS), with vLLM's flags and defaults (``--allowed-origins``,
    ``--allowed-methods``, ``--allowed-headers``: any; ``--allow-credentials``: no), so a web UI served from another
    origin reads our answers as it reads vLLM's. No origins: no CORS headers (browsers then refuse cross-origin reads;
    curl and SDK clients never look at them)."""

    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False


def add_cors(app: Any, policy: CorsPolicy) -> None:  # noqa: ANN401 - a FastAPI app
    """Starlette's CORS middleware, added last so it is outermost: a preflight (OPTIONS, which browsers send without
    the API key) is answered before the key is asked for, and every response — a 401 or 413 too — carries the
    headers a page needs to read it."""
    if not policy.allowed_origins:
        return
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(CORSMiddleware, allow_origins=list(policy.allowed_origins), allow_methods=list(policy.allowed_methods),
                       allow_headers=list(policy.allowed_headers), allow_credentials=policy.allow_credentials)


def error_response_body(message: str, kind: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


async def send_error(send: Send, status: int, message: str, kind: str, code: str,
                     extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = error_response_body(message, kind, code)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *(extra_headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AccessMiddleware:
    """Refuses unauthenticated ``/v1/`` requests (401) and bodies over the limit (413) before the
    app sees them; ``on_refused(status)`` counts each refusal (the server's Prometheus metrics)."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy, on_refused: Callable[[int], None] = lambda status: None) -> None:
        self.app, self.policy, self.on_refused = app, policy, on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}
        if self.policy.needs_key(scope.get("path", "")) and not self.policy.key_matches(headers.get("authorization")):
            self.on_refused(401)
            missing = "authorization" not in headers
            message = ("missing API key: send 'Authorization: Bearer <key>'" if missing
                       else "invalid API key")  # never echo what was sent
            await send_error(send, 401, message, "invalid_request_error", "invalid_api_key",
                             [(b"www-authenticate", b"Bearer")])
            return
        limit = self.policy.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await self._too_large(send, limit)
            return
        body, more = bytearray(), True
        while more:  # read the body here, never more than limit + 1 bytes of it
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                await self._too_large(send, limit)
                return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: disconnect notices, as the app expects

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send, limit: int) -> None:
        self.on_refused(413)
        await send_error(send, 413, f"request body too large: the limit is {limit} bytes (--max-body-bytes)",
                         "invalid_request_error", "request_too_large", [(b"connection", b"close")])
