"""Request bodies → :class:`specdec.sampling.SamplingParams`: limits, logprobs and output
constraints, each refused with a 400 that names the field (OpenAI's error object)."""

from __future__ import annotations

from typing import Any

from specdec.errors import SpecdecError
from specdec.sampling import MAX_LOGPROBS, SamplingParams
from specdec.server.schemas import ChatCompletionRequest, CompletionRequest, StructuredOutputs, error_body, joined_text
from specdec.structured import StructuredOutput, schema_text

#: at most this many stop strings per request, each at most MAX_STOP_CHARS long: every step checks
#: them against the new text, so an unbounded list is a per-token cost a client could impose
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
#: at most this many ``stop_token_ids`` (vLLM's extension)
MAX_STOP_TOKEN_IDS = 256
#: max_tokens when a request leaves it out (sampling_params says why)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
CHAT_DEFAULT_MAX_TOKENS = 256
#: at most this many choices per request (``n``; each is a generation of its own, and never more than
#: the server's --max-concurrency)
MAX_CHOICES = 16
#: at most this many ``logit_bias`` entries (OpenAI's limit): each is an operation on every scored row
MAX_LOGIT_BIAS = 300


#: seconds a refused client is told to wait (Retry-After) when the queue is full, here and by Ray Serve's proxy
RETRY_AFTER_S = 1


class APIError(Exception):
    """Answered as OpenAI's error object with this HTTP status (see ``create_app``)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        #: extra response headers (a queue-full 429's Retry-After, as OpenAI and Ray Serve's proxy send it)
        self.headers = headers

    @classmethod
    def internal(cls, exc: BaseException) -> "APIError":
        """A failure on the server's side (status 500): what failed, without the traceback (that goes to the log)."""
        return cls(500, f"internal server error: {type(exc).__name__}: {exc}", "internal_server_error", code="internal_error")

    def body(self) -> dict:
        """OpenAI's error object of this error."""
        return error_body(self.message, self.kind, self.param, self.code)


def sampling_params(req: CompletionRequest | ChatCompletionRequest, context_len: int, prompt_len: int,
                    max_tokens_limit: int | None = None,
                    chat_default_max_tokens: int | None = CHAT_DEFAULT_MAX_TOKENS) -> SamplingParams:
    """The request's sampling fields → :class:`SamplingParams`, or a 400 that names the field.
    ``chat_default_max_tokens``: a chat request's limit when it sets none (serve's --default-max-tokens; None: the
    rest of the context)."""
    if not 1 <= req.n <= MAX_CHOICES:
        raise APIError(400, f"n must be in 1..{MAX_CHOICES} (choices per request), got {req.n}", param="n")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, f"best_of {req.best_of} is not supported: only best_of = n, each choice returned (got n={req.n})",
                       param="best_of")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise APIError(400, f"stop: at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters "
                            f"(got {len(stop)}, longest {max((len(s) for s in stop), default=0)})", param="stop")
    if len(req.stop_token_ids or []) > MAX_STOP_TOKEN_IDS:
        raise APIError(400, f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} (got {len(req.stop_token_ids)})", param="stop_token_ids")
    logprobs = _logprobs_asked(req)
    # unset: completions 16 tokens (OpenAI's legacy default, vLLM's too), chat up to --default-max-tokens, 256 by
    # default (OpenAI's chat runs to the context's end; a CPU answer that long takes minutes, so a cap), never past
    # the context or the limit
    rest = max(1, context_len - prompt_len)
    if isinstance(req, ChatCompletionRequest):
        cap = rest if chat_default_max_tokens is None else chat_default_max_tokens
    else:
        cap = COMPLETIONS_DEFAULT_MAX_TOKENS
    default = min(cap, rest, max_tokens_limit or cap)
    field = max_tokens_field(req)
    asked = req.max_completion_tokens if field == "max_completion_tokens" else req.max_tokens
    if asked is not None and asked < 1:  # 0 is an answer of nothing, not "unset" (it fell back to the default)
        hint = " (to score a prompt, send echo with logprobs and max_tokens 1)" if getattr(req, "echo", False) else ""
        raise APIError(400, f"{field} must be an integer >= 1, got {asked}{hint}", param=field)
    max_tokens = asked if asked is not None else default
    if max_tokens_limit is not None and max_tokens > max_tokens_limit:
        raise APIError(400, f"{field} {max_tokens} exceeds this server's limit of {max_tokens_limit} (--max-tokens-limit)",
                       param=field)
    try:
        return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                              seed=req.seed, max_tokens=max_tokens, stop=stop, ignore_eos=req.ignore_eos, logprobs=logprobs,
                              structured=_structured(req), presence_penalty=req.presence_penalty,
                              frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty,
                              logit_bias=_logit_bias(req.logit_bias), min_tokens=req.min_tokens,
                              stop_token_ids=list(req.stop_token_ids or []),
                              include_stop_str_in_output=req.include_stop_str_in_output,
                              skip_special_tokens=req.skip_special_tokens,
                              prediction=None if req.prediction is None else joined_text(req.prediction.content),
                              prompt_logprobs=_prompt_logprobs_asked(req, logprobs))
    except SpecdecError as exc:
        raise APIError(400, str(exc), param=field_named(str(exc))) from None


def max_tokens_field(req: CompletionRequest | ChatCompletionRequest) -> str:
    """Which field a request's token limit came from (chat's max_completion_tokens wins over max_tokens):
    the ``param`` of an error about it."""
    return "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` (token ids as JSON object keys, so strings) → ids → bias."""
    if not bias:
        return None
    if len(bias) > MAX_LOGIT_BIAS:
        raise APIError(400, f"logit_bias: at most {MAX_LOGIT_BIAS} token ids (got {len(bias)})", param="logit_bias")
    ids: dict[int, float] = {}
    for token, value in bias.items():
        try:
            ids[int(token)] = value
        except ValueError:
            raise APIError(400, f"logit_bias keys must be token ids, got {token!r}", param="logit_bias") from None
    return ids


def field_named(message: str) -> str | None:
    """The request field a SamplingParams error is about (its messages start with the field's name)."""
    field = message.split(" ", 1)[0]
    return field if field in CompletionRequest.model_fields else None


def guided_fields(req: CompletionRequest | ChatCompletionRequest) -> dict[str, Any]:
    """The request's vLLM ``guided_*`` fields that are set, under structured_outputs' names (``regex`` for
    ``guided_regex``), in the order json, regex, choice, grammar."""
    return {name: getattr(req, f"guided_{name}") for name in ("json", "regex", "choice", "grammar")
            if getattr(req, f"guided_{name}") is not None}


def constraint_field(req: CompletionRequest | ChatCompletionRequest) -> str | None:
    """The request field that carried its output constraint: what a 400 about the constraint names as its param
    (a bad regex or grammar is found only when the job compiles it, and was answered with param null)."""
    if req.response_format is not None and req.response_format.type != "text":
        return "response_format"
    if req.structured_outputs is not None:
        return "structured_outputs"
    guided = guided_fields(req)
    if guided:
        return f"guided_{next(iter(guided))}"
    return "tools" if getattr(req, "tools", None) else None


def _structured(req: CompletionRequest | ChatCompletionRequest) -> StructuredOutput | None:
    """The request's output constraint: OpenAI's ``response_format`` or vLLM's ``structured_outputs``."""
    fmt, extension = req.response_format, req.structured_outputs
    guided = guided_fields(req)
    if guided:  # vLLM's older fields: the same constraint under structured_outputs' names
        if extension is not None:
            raise APIError(400, "give structured_outputs or guided_*, not both", param="structured_outputs")
        extension = StructuredOutputs.model_validate(guided)
    if fmt is not None and fmt.type != "text" and extension is not None:
        raise APIError(400, "give response_format or structured_outputs, not both", param="response_format")
    if fmt is not None and fmt.type == "json_object":
        return StructuredOutput(json_object=True)
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise APIError(400, "response_format of type json_schema needs a json_schema object", param="response_format")
        try:
            return StructuredOutput.from_schema(fmt.json_schema.json_schema)
        except SpecdecError as exc:
            raise APIError(400, str(exc), param="response_format") from None
    if extension is None:
        return None
    choice = tuple(extension.choice) if extension.choice is not None else None
    schema = None if extension.json_schema is None else schema_text(extension.json_schema)
    try:
        return StructuredOutput(json_schema=schema, json_object=bool(extension.json_object), regex=extension.regex,
                                choice=choice, grammar=extension.grammar)
    except SpecdecError as exc:  # (guided_* fields: named as sent)
        field = constraint_field(req) or "structured_outputs"
        raise APIError(400, f"{field}: {exc}", param=field) from None


def _prompt_logprobs_asked(req: CompletionRequest | ChatCompletionRequest, logprobs: int | None) -> int | None:
    """SamplingParams.prompt_logprobs: alternatives per prompt token for vLLM's ``prompt_logprobs`` and for
    completions' ``echo`` with ``logprobs`` (each response part shows its own number of them)."""
    asked = req.prompt_logprobs
    if asked is not None:
        if not 0 <= asked <= MAX_LOGPROBS:
            raise APIError(400, f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {asked}", param="prompt_logprobs")
        if req.stream:  # vLLM's rule too: a stream has no place for them
            raise APIError(400, "prompt_logprobs are not available when stream is true", param="prompt_logprobs")
    echoed = logprobs if isinstance(req, CompletionRequest) and req.echo else None
    return None if asked is None and echoed is None else max(asked or 0, echoed or 0)


def _logprobs_asked(req: CompletionRequest | ChatCompletionRequest) -> int | None:
    """SamplingParams.logprobs from the request: completions name the number of alternatives in
    ``logprobs``; chat sets ``logprobs: true`` and the number in ``top_logprobs`` (OpenAI's shapes)."""
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise APIError(400, f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {req.top_logprobs}",
                           param="top_logprobs")
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs
