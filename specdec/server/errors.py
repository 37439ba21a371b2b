"""The server's errors as OpenAI's error object, each counted under its endpoint: refusals (``APIError``),
FastAPI's own 404/405, invalid bodies, failures of ours outside a generation (500), and what a failed
generation tells its client."""

from __future__ import annotations

import logging
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.errors import DrafterError, SpecdecError, WeightsError
from specdec.server.metrics import Metrics
from specdec.server.params import APIError
from specdec.server.schemas import error_body, validation_message

#: the ``endpoint`` label of the generation routes' status counts
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}

log = logging.getLogger("specdec.server")


def install_error_handlers(app: FastAPI, metrics: Metrics) -> Callable[[Request], str]:
    """Register the handlers on ``app``; return ``endpoint_of``, the label a request's status is counted under."""

    def endpoint_of(request: Request) -> str:
        """The ``endpoint`` label of a request's status count: as successes are counted ("chat",
        "completions"), other routes by path (an unknown one: "other", so clients cannot mint labels)."""
        path = request.url.path
        return ENDPOINTS.get(path, path if path in {route.path for route in app.routes} else "other")

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        metrics.requests.labels(endpoint_of(request), str(exc.status)).inc()
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """An unknown route or a wrong method (FastAPI's own 404/405) as OpenAI's error object, as every other error."""
        message = {404: f"Invalid URL ({request.method} {request.url.path})",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        metrics.requests.labels(endpoint_of(request), str(exc.status_code)).inc()
        return JSONResponse(error_body(message), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        """A failure of ours (not the request's) outside a generation (the generation routes answer those) as
        OpenAI's error object with status 500, as vLLM answers it, instead of Starlette's plain-text "Internal
        Server Error" (Starlette still logs the traceback, and the connection closes)."""
        metrics.requests.labels(endpoint_of(request), "500").inc()
        return JSONResponse(APIError.internal(exc).body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.requests.labels(endpoint_of(request), "400").inc()
        message, where = validation_message(list(exc.errors()))
        return JSONResponse(error_body(message, param=where), status_code=400)

    return endpoint_of


def generation_failure(exc: Exception, endpoint: str) -> APIError:
    """What a client is told when its generation fails, streamed or not: a refusal as it is, the request's
    fault (a SpecdecError) as a 400, a failure of ours as a 500 (its traceback to the log) — a WeightsError
    raised mid-generation (NaN logits from corrupt weights) and a DrafterError (a method's code broke its contract)
    among them: no request causes it."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, SpecdecError) and not isinstance(exc, (WeightsError, DrafterError)):
        return APIError(400, str(exc))
    log.error("a %s generation failed", endpoint, exc_info=exc)
    return APIError.internal(exc)
