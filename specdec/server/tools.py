"""Tool calling in the chat endpoint (OpenAI's ``tools`` / ``tool_choice``; vLLM's
``--tool-call-parser hermes``): the tools go to the model's own chat template, which tells it to
answer a call as ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` (Qwen2.5's and Hermes'
convention), and such blocks in the output become the message's ``tool_calls``.

Decoding is untouched — speculation and the output's exactness work as for any text (a call's JSON
repeats the tool's schema and earlier calls, which the suffix table drafts well). ``tool_choice``
``"none"`` leaves the tools out of the prompt (vLLM's default); ``"auto"`` (the default with tools)
lets the model choose; ``"required"`` (any tool) and a named function constrain the output to
calls in the template's form, their arguments to the tool's JSON Schema (:func:`forced_call`: a
grammar through :mod:`specdec.structured`, exact under speculation like any other). As OpenAI's,
an answer may make several calls unless ``parallel_tool_calls`` is false: then a forced answer is
one call and a free one keeps its first.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec.errors import SpecdecError, TemplateArgumentError
from specdec.server.params import APIError, guided_fields
from specdec.server.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice, joined_text
from specdec.schema_checks import refuse_unenforced, schema_problem
from specdec.structured import INSTALL_HINT, StructuredOutput
from specdec.structured import available as structured_available

if TYPE_CHECKING:
    from specdec.tokenizer import Tokenizer

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class RequestTools:
    """What a chat request's outputs are parsed for: its tools' names, and whether an answer may
    make several calls (OpenAI's ``parallel_tool_calls``, true unless the request says false)."""

    names: frozenset[str]
    parallel: bool = True
    #: tool_choice named one function: OpenAI ends such an answer with finish_reason "stop", not "tool_calls"
    named: bool = False

    def finish_reason(self, generated: str | None, called: bool) -> str | None:
        """The choice's finish_reason: ``tool_calls`` where the answer made calls — unless a named
        tool_choice forced them (OpenAI: ``stop``) or max_tokens cut the answer (``length``, as
        OpenAI says whatever was cut)."""
        if not called or generated in (None, "length"):
            return generated
        return "stop" if self.named else "tool_calls"


def template_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools the chat template is given (OpenAI's shape, which HF templates read), or None: no
    tools, or ``tool_choice`` ``"none"``. A choice this server cannot honour is a 400."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none", "auto"):
            wanted = "names a tool" if isinstance(choice, NamedToolChoice) else f"is {choice!r}"
            raise APIError(400, f"tool_choice {wanted} but the request has no tools", param="tool_choice")
        return None
    names = [tool.function.name for tool in req.tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tools: each function needs a name of its own", param="tools")
    for tool in req.tools:  # OpenAI refuses a schema that is none whatever tool_choice is; forced_call compiles it
        problem = schema_problem(tool.function.parameters)
        if problem is not None:
            raise APIError(400, f"tools: the parameters of {tool.function.name!r} are not a JSON Schema: {problem}",
                           param="tools")
    if choice == "none":  # checked all the same, as OpenAI does
        return None
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise APIError(400, f"tool_choice names {choice.function.name!r}, which is not among the tools", param="tool_choice")
    return [tool.model_dump(exclude_none=True) for tool in req.tools]


def forced_call(req: ChatCompletionRequest) -> StructuredOutput | None:
    """``tool_choice`` ``"required"`` or a named function: the output constrained to calls — to any
    of the tools, or to the named one — each ``<tool_call>\n{"name": …, "arguments": ARGS}\n</tool_call>``
    (the form Qwen2.5's template asks for), ARGS following the tool's ``parameters`` schema (any
    object without one), one call or several on lines of their own (one when ``parallel_tool_calls``
    is false). None otherwise. Built with xgrammar (the ``structured`` extra)."""
    choice = req.tool_choice
    if not req.tools or choice in (None, "auto", "none"):
        return None
    guided = bool(guided_fields(req))
    if req.response_format is not None and req.response_format.type != "text" or req.structured_outputs is not None or guided:
        # (guided_*, vLLM's older names, were replaced by the call grammar without a word)
        raise APIError(400, "tool_choice 'required' or a named function already constrains the output: "
                            "drop response_format / structured_outputs / guided_*", param="tool_choice")
    if not structured_available():
        raise APIError(400, f"tool_choice {choice if isinstance(choice, str) else 'naming a function'}: {INSTALL_HINT}",
                       param="tool_choice")
    import xgrammar

    def literal(text: str) -> Any:
        return xgrammar.Grammar.from_ebnf("root ::= " + json.dumps(text))

    tools = [tool for tool in req.tools if not isinstance(choice, NamedToolChoice) or tool.function.name == choice.function.name]
    calls = []
    for tool in tools:
        schema = tool.function.parameters or {"type": "object"}
        try:
            refuse_unenforced(f"tools: the parameters schema of {tool.function.name!r}", schema)
        except SpecdecError as exc:
            raise APIError(400, str(exc), param="tools") from None
        try:
            arguments = xgrammar.Grammar.from_json_schema(json.dumps(schema))
        except Exception as exc:  # noqa: BLE001 - xgrammar's errors for schemas it cannot compile
            reason = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(exc).strip().splitlines()[0])  # its C++ log prefix
            raise APIError(400, f"tools: the parameters of {tool.function.name!r} are not a usable JSON Schema: {reason}",
                           param="tools") from None
        opening = f'{CALL_OPEN}\n{{"name": {json.dumps(tool.function.name)}, "arguments": '
        calls.append(xgrammar.Grammar.concat(literal(opening), arguments, literal("}\n" + CALL_CLOSE)))
    grammar = str(calls[0] if len(calls) == 1 else xgrammar.Grammar.union(*calls))
    if req.parallel_tool_calls is not False:  # root: one call or more, a newline between two
        one_call = _EBNF_TOKEN.sub(lambda m: _ONE_CALL if m.group(0) == "root" else m.group(0), grammar)
        grammar = f'root ::= {_ONE_CALL} ("\\n" {_ONE_CALL})*\n' + one_call
    return StructuredOutput(grammar=grammar)


#: the rule a forced answer's calls repeat (xgrammar names the rules it generates root_1, basic_…)
_ONE_CALL = "specdec_one_tool_call"
#: an EBNF string literal, a character class, or the rule name ``root``: renaming the root rule must not
#: touch a literal "root" (a tool's parameter may be called that)
_EBNF_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\broot\b')


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates read them: content as one string; an assistant's earlier calls
    with their arguments as objects (templates write them with ``tojson``: OpenAI's JSON text
    would be quoted twice)."""
    rendered = []
    for index, message in enumerate(messages):
        item: dict[str, Any] = {"role": message.role, "content": "" if message.content is None else joined_text(message.content)}
        if message.tool_calls:
            calls = []
            for call in message.tool_calls:
                try:
                    arguments = json.loads(call.function.arguments)
                except json.JSONDecodeError:
                    raise APIError(400, f"messages.{index}.tool_calls: arguments must be JSON text, got "
                                        f"{call.function.arguments[:80]!r}", param=f"messages.{index}.tool_calls") from None
                calls.append({"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}})
            item["tool_calls"] = calls
        elif message.content is None:
            raise APIError(400, f"messages.{index}.content: only an assistant message with tool_calls may omit it",
                           param=f"messages.{index}.content")
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        elif message.role == "tool":  # OpenAI's 400 too: the answer must say which call it answers
            raise APIError(400, f"messages.{index}.tool_call_id: a tool message needs the id of the call it answers",
                           param=f"messages.{index}.tool_call_id")
        rendered.append(item)
    return rendered


def parse_tool_calls(text: str, names: frozenset[str] = frozenset(), parallel: bool = True,
                     cut: bool = False) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of an output: every well-formed ``<tool_call>`` block (a JSON object
    with a string ``name`` and object ``arguments``) becomes an OpenAI tool call, the rest of the
    text the content (None when nothing is left). A malformed block stays in the content, as text. An unclosed
    one at the end is a call when its JSON is whole (a stop string or max_tokens before the closing tag: vLLM's
    parsers read it too); else, where the output was cut by max_tokens (``cut``) or after complete calls, its markup
    is dropped — it means nothing to a client — and elsewhere it is text (prose that names the tag).
    ``parallel`` false: only the first call is kept (vLLM's behaviour; the others are dropped).

    Small models often answer a call without the tags — the whole output one JSON object (or a list
    of them), bare or in a ```json fence (Qwen2.5-Coder-1.5B does): that is a call too when it names
    one of the request's tools (``names``), so ordinary JSON answers stay content."""
    calls: list[dict[str, Any]] = []

    def take(match: re.Match) -> str:
        try:
            call = _call(json.loads(match.group(1)))
        except json.JSONDecodeError:
            call = None
        if call is None:
            return match.group(0)
        calls.append(call)
        return ""

    content = _CALL.sub(take, text).strip()
    opened = content.rfind(CALL_OPEN)
    dropped = False
    if opened >= 0 and CALL_CLOSE not in content[opened:]:
        try:
            tail = _call(json.loads(content[opened + len(CALL_OPEN):]))
        except json.JSONDecodeError:
            tail = None
        if tail is not None or cut or calls:
            calls += [tail] if tail is not None else []
            content, dropped = content[:opened].strip(), tail is None
    if calls:
        return content or None, calls if parallel else calls[:1]
    if dropped:  # the answer's only call was cut: the text before it (a client reads finish_reason "length")
        return content, []
    bare = _BARE.fullmatch(text.strip())
    if bare is not None and names:
        try:
            found = json.loads(bare.group(1))
        except json.JSONDecodeError:
            return text, []
        found = [_call(item) for item in (found if isinstance(found, list) else [found])]
        if found and all(call is not None and call["function"]["name"] in names for call in found):
            return None, found if parallel else found[:1]  # type: ignore[return-value]
    return text, []


#: an output that is only JSON (an object or a list), bare or in a ```json fence
_BARE = re.compile(r"(?:```(?:json)?\s*)?(\{.*\}|\[.*\])(?:\s*```)?", re.DOTALL)


def may_be_bare_call(start: str) -> bool:
    """Can an output beginning with ``start`` still be one tagless call — JSON, bare or in a ```json (or
    bare ```) fence (:data:`_BARE`)? A fence of another language (```python, a coder model's usual
    answer) or a fence whose first text is not JSON cannot: such answers stream from there."""
    if not start or start.startswith(("{", "[")):
        return True
    if not start.startswith("```"):
        return "```".startswith(start)
    body = start[3:]
    if not body.startswith("json"):
        if "json".startswith(body):
            return True  # ``` or ```js…: the tag is not known yet
        body = body if body[:1].isspace() or body[:1] in "{[" else "x"  # another language's tag
    else:
        body = body[4:]
    body = body.lstrip()
    return not body or body.startswith(("{", "["))


def _call(found: Any) -> dict[str, Any] | None:
    """An OpenAI tool call from a parsed ``{"name": …, "arguments": {…}}``, or None if it is not one."""
    if not isinstance(found, dict) or not isinstance(found.get("name"), str) or not isinstance(found.get("arguments", {}), dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": found["name"], "arguments": json.dumps(found.get("arguments", {}), ensure_ascii=False)}}


class ToolTextFilter:
    """Streams an output's text while holding back what may be a tool call: text that could be the
    start of ``<tool_call>`` waits for the next token, nothing after an opened call is streamed, and
    an output that begins as JSON (a call without tags) waits for its end (the calls go out whole
    in the last chunk, :func:`parse_tool_calls`)."""

    def __init__(self, names: frozenset[str] = frozenset(), parallel: bool = True) -> None:
        self.names = names  # the request's tools
        self.parallel = parallel  # several calls kept (else the first: parse_tool_calls)
        self.held = ""
        self.in_call = False
        self.at_start = True  # nothing streamed yet: the whole output may still be a bare call

    def push(self, text: str) -> str:
        """The part of ``text`` (the output's next piece) that can be streamed now."""
        self.held += text
        if self.in_call:
            return ""
        if self.at_start:
            if may_be_bare_call(self.held.lstrip()):
                return ""
            self.at_start = False
        opened = self.held.find(CALL_OPEN)
        if opened >= 0:
            self.in_call = True
            out, self.held = self.held[:opened], self.held[opened:]
            return out
        keep = next((n for n in range(min(len(CALL_OPEN) - 1, len(self.held)), 0, -1) if CALL_OPEN.startswith(self.held[-n:])), 0)
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return out

    def flush(self, called: bool, cut: bool = False) -> str:
        """What was held back, at the end of the output: when it made calls (they go out as
        ``tool_calls``) the text around them, else all of it (a malformed call is content, as
        :func:`parse_tool_calls` says; ``cut``: by max_tokens) — the content a non-streamed answer has."""
        held, self.held = self.held, ""
        if self.in_call:  # the text from the first <tool_call> on: around the calls, a cut call's markup left out
            content, _ = parse_tool_calls(held, self.names, self.parallel, cut)
            return content or ""
        return "" if called else held


def chat_prompt(tokenizer: "Tokenizer", req: ChatCompletionRequest) -> tuple[list[dict[str, Any]] | list[int], RequestTools | None]:
    """The request's prompt — messages for the chat template, or, with tools, the token ids the
    template renders with them — and the tools the output is parsed for (None: not parsed). No messages, or a model whose template ignores tools (it would answer without knowing
    them), is a 400. (A forced call's constraint is :func:`forced_call`'s.)"""
    if not req.messages:
        raise APIError(400, "messages must not be empty", param="messages")
    messages = template_messages(req.messages)
    tools = template_tools(req)
    continued = req.continue_final_message
    if continued and req.add_generation_prompt:
        raise APIError(400, "continue_final_message continues the last message: send add_generation_prompt false "
                            "with it (vLLM's rule)", param="continue_final_message")
    if continued and req.messages[-1].role != "assistant":
        raise APIError(400, "continue_final_message needs an assistant message last (the answer to continue)",
                       param="continue_final_message")
    rendering = {"add_generation_prompt": req.add_generation_prompt, "continue_final_message": continued,
                 "template_kwargs": req.chat_template_kwargs}
    try:
        if tools is None:
            return (messages if req.add_generation_prompt and not continued and not req.chat_template_kwargs else
                    tokenizer.encode(tokenizer.render_chat(messages, **rendering), add_special_tokens=False)), None
        with_tools = tokenizer.render_chat(messages, tools=tools, **rendering)
        if with_tools == tokenizer.render_chat(messages, **rendering):
            raise APIError(400, "this model's chat template does not describe tools to the model", param="tools")
    except TemplateArgumentError as exc:
        raise APIError(400, str(exc), param="chat_template_kwargs") from None
    except SpecdecError as exc:
        raise APIError(400, str(exc), param="messages") from None
    names = frozenset(tool["function"]["name"] for tool in tools)
    return tokenizer.encode(with_tools, add_special_tokens=False), RequestTools(names, req.parallel_tool_calls is not False,
                                                                            isinstance(req.tool_choice, NamedToolChoice))


def streamed_delta(held: ToolTextFilter, text: str, output: str | None, cut: bool = False) -> dict[str, Any]:
    """A streamed chat chunk's delta when tools are on: the part of ``text`` that may go out now; at
    the end (``output``: the whole output; ``cut``: by max_tokens) also what was held back, or the calls it made."""
    content = held.push(text)
    if output is None:
        return {"content": content}
    _, calls = parse_tool_calls(output, held.names, held.parallel, cut)
    content += held.flush(called=bool(calls), cut=cut)
    delta: dict[str, Any] = {"content": content} if content or not calls else {}
    if calls:
        delta["tool_calls"] = [{"index": index, **call} for index, call in enumerate(calls)]
    return delta


def answered_message(text: str, tools: RequestTools | None, cut: bool = False) -> tuple[dict[str, Any], bool]:
    """The assistant message of a non-streamed answer, and whether it made calls (then its
    finish_reason is ``tool_calls``); ``tools``: the request's (None: no tools, no parsing); ``cut``: the output
    ended by max_tokens."""
    if tools is None:
        return {"role": "assistant", "content": text}, False
    content, tool_calls = parse_tool_calls(text, tools.names, tools.parallel, cut)
    if not tool_calls:
        return {"role": "assistant", "content": content}, False
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}, True
