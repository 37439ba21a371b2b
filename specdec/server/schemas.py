"""OpenAI-compatible request/response shapes (the subset we serve) and the error object."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specdec.tokenizer import not_unicode


class SpeculativeOverride(BaseModel):
    """Per-request override, within what the server loaded (extension field ``speculative``)."""

    model_config = ConfigDict(extra="forbid")
    method: Optional[str] = None
    num_speculative_tokens: Optional[Union[int, Literal["auto"]]] = None
    #: re-decode this (greedy) request plainly and answer usage.speculative.audit (server/audit.py)
    audit: bool = False


class JsonSchemaSpec(BaseModel):
    """OpenAI's ``response_format.json_schema``: the schema under ``schema`` (``strict`` is accepted;
    the output always follows the schema)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Optional[str] = None
    description: Optional[str] = None
    json_schema: Union[dict[str, Any], bool] = Field(alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``text`` (no constraint), ``json_object`` or ``json_schema``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaSpec] = None


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` extension: exactly one of a JSON schema, any JSON object, a
    regex, a list of choices or an EBNF grammar."""

    model_config = ConfigDict(extra="forbid")
    json_schema: Optional[Union[dict[str, Any], str]] = Field(default=None, alias="json")
    json_object: Optional[bool] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None


class TextPart(BaseModel):
    """One part of a message's content in OpenAI's list form (text only: this server reads no images
    or audio, and a request with such a part gets a 400 naming it, not an answer that ignored it)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


def joined_text(content: Union[str, list[TextPart]]) -> str:
    """A content field as one string: the text itself, or its parts' texts one after the other."""
    return content if isinstance(content, str) else "".join(part.text for part in content)


class Prediction(BaseModel):
    """OpenAI's Predicted Outputs: ``{"type": "content", "content": ...}``, the text the output is
    expected to largely repeat (:mod:`specdec.prediction`)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["content"]
    content: Union[str, list[TextPart]]


class StreamOptions(BaseModel):
    """OpenAI's ``stream_options``: ``include_usage`` adds a last chunk with the whole request's usage."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """``"temperature": null`` is the default, as OpenAI's spec ("number or null") and vLLM read it: clients
        that send unset fields as null (Java, Go, TypeScript SDKs) were refused with a 400. Not ``speculative``,
        where null means plain decoding."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {key: value for key, value in data.items()
                if value is not None or key not in fields or key == "speculative"
                or (fields[key].default is None and fields[key].default_factory is None)}
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None)
    max_completion_tokens: Optional[int] = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    #: vLLM's: keep the stop string that ended the output in its text
    include_stop_str_in_output: bool = False
    #: vLLM's: false writes the special tokens the model generates into the text
    skip_special_tokens: bool = True
    #: OpenAI's legacy ``best_of``: only equal to ``n`` is served (each choice is returned; vLLM V1 the same)
    best_of: Optional[int] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = 1
    ignore_eos: bool = False
    # absent = the server's default drafter; null = plain decoding; an object = override
    speculative: Optional[SpeculativeOverride] = Field(default_factory=lambda: SpeculativeOverride())
    # OpenAI's penalties and vLLM's repetition_penalty (specdec.penalties: exact under speculation)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # vLLM's extensions: token ids that end the output, and the fewest tokens before anything may end it
    stop_token_ids: Optional[list[int]] = None
    min_tokens: int = 0
    #: token id (as a string, OpenAI's form) → bias added to its logit, -100..100
    logit_bias: Optional[dict[str, float]] = None
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputs] = None
    #: vLLM's older names for structured_outputs' fields (guided_json …), still in clients' code
    guided_json: Optional[Union[dict[str, Any], str]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    #: OpenAI's Predicted Outputs: drafted from, so faster where right; the output is the same
    prediction: Optional[Prediction] = None
    #: vLLM's: each prompt token's log-probability (and this many alternatives), non-streamed only
    prompt_logprobs: Optional[int] = None


class CompletionRequest(_SamplingFields):
    #: one prompt (text or token ids) or several (OpenAI's batch form: n choices for each, in order)
    prompt: Union[str, list[int], list[str], list[list[int]]]
    #: the target's log-probability of each emitted token and of this many alternatives
    logprobs: Optional[int] = None
    #: put the prompt before the output (with ``logprobs``: the prompt tokens' log-probabilities too)
    echo: bool = False
    #: the text after the insertion point: the output fills the middle (a code model's FIM tokens)
    suffix: Optional[str] = None


class FunctionSpec(BaseModel):
    """A tool's function as OpenAI describes it (``parameters``: a JSON Schema)."""

    model_config = ConfigDict(extra="forbid")
    #: OpenAI's rule for function names (a space or a dot was accepted, and a model asked to call it)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming one function."""

    type: Literal["function"]
    function: NamedFunction


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    """An assistant's earlier call, sent back in the conversation."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    #: a string, or OpenAI's list of content parts (text parts only); null only beside ``tool_calls``
    content: Optional[Union[str, list[TextPart]]] = None
    #: OpenAI's participant name: accepted; chat templates (Qwen's, Llama's) do not render it
    name: Optional[str] = None
    #: an assistant's calls (server/tools.py), and a tool message's answer to one
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    #: OpenAI's function tools (server/tools.py); ``parallel_tool_calls`` false: an answer makes one
    #: call at most (a forced one is constrained to one, a free one keeps its first)
    tools: Optional[list[ToolSpec]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[bool] = None
    #: vLLM's: end the prompt with the assistant turn's header (true), or continue the last (assistant)
    #: message as it stands (continue_final_message true, add_generation_prompt false): prefilling an answer
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    #: vLLM's: where the answer continues the last message (its role is the answer's: add_generation_prompt false),
    #: that message's text comes first in the answer's content
    echo: bool = False
    #: vLLM's: further variables the model's chat template reads (a template's own switches)
    chat_template_kwargs: Optional[dict[str, Any]] = None


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize``: a ``prompt`` (text) or chat ``messages`` (with ``tools``, as the chat
    endpoint renders them: generation prompt included). Other fields are logged and ignored, as on the
    /v1 endpoints: counting a completion request's tokens by posting its own body (max_tokens and all) is common."""

    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    prompt: Optional[str] = None
    add_special_tokens: bool = True
    messages: Optional[list[ChatMessage]] = None
    tools: Optional[list[ToolSpec]] = None


class DetokenizeRequest(BaseModel):
    """vLLM's ``/detokenize``: token ids → text (other fields logged and ignored, as /tokenize's)."""

    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    tokens: list[int]


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """pydantic's errors for a request body → one message and the field it names: the first error, except a
    content part of a type this server does not read (an image, audio), named as such — pydantic tries a
    content's plain-string form first and would say only "Input should be a valid string"."""
    for error in errors:
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        if error.get("type") == "literal_error" and loc[-1:] == ["type"] and "content" in loc:
            where = field_path(loc[:-1])
            return (f"invalid request: {where}: a content part of type {error.get('input')!r}; this server reads "
                    "text parts only (no images or audio)", where)
    first = errors[0] if errors else {}
    where = field_path(first.get("loc", ()))
    return f"invalid request: {where}: {first.get('msg', 'malformed')}", where or None


#: the names pydantic gives a union's members in an error's location (``prompt.str``), not fields
_UNION_MEMBERS = {"str", "int", "float", "bool", "dict", "list", "none"}


def field_path(loc: Any) -> str:
    """An error location as the request's field path (``messages.0.content``): without ``body`` and the
    union members pydantic inserts (``prompt.str``, ``tool_choice.literal['none','auto','required']``,
    ``NamedToolChoice``), which name no field a client sent."""
    parts = [str(part) for part in loc if part != "body"]
    return ".".join(part for part in parts if not ("[" in part or part in _UNION_MEMBERS or part[:1].isupper()))


def lone_surrogate_at(value: Any, where: str = "") -> str | None:
    """The field of a parsed JSON body holding a string that is not Unicode text — a lone surrogate, which
    JSON's \\ud800 escapes can spell and no tokenizer encodes (:func:`specdec.tokenizer.not_unicode`) — or None."""
    if isinstance(value, str):
        return (where or "body") if not_unicode(value) is not None else None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = lone_surrogate_at(item, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None



#: the request body each POST route reads (routes parse the body themselves, for OpenAI-style errors, so FastAPI
#: cannot see it): published in /openapi.json for /docs' "Try it out" and client generators
REQUEST_BODIES: dict[str, type[BaseModel]] = {}


def document_request_bodies(app: Any) -> None:  # noqa: ANN401 - fastapi.FastAPI
    """Put :data:`REQUEST_BODIES`' schemas into ``app``'s OpenAPI document (it listed no request body at all)."""
    from pydantic.json_schema import models_json_schema

    plain_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = plain_openapi()
        models = list(dict.fromkeys(REQUEST_BODIES.values()))
        refs, defs = models_json_schema([(model, "validation") for model in models],
                                        ref_template="#/components/schemas/{model}")
        document.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
        for path, model in REQUEST_BODIES.items():
            operation = document["paths"].get(path, {}).get("post")
            if operation is not None:
                operation["requestBody"] = {"required": True,
                                            "content": {"application/json": {"schema": refs[(model, "validation")]}}}
        app.openapi_schema = document
        return document

    app.openapi = openapi


REQUEST_BODIES.update({"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest,
                       "/tokenize": TokenizeRequest, "/detokenize": DetokenizeRequest})
