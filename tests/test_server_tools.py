"""Tool calling in the chat endpoint (server/tools.py): the tools reach the model through its chat
template, ``<tool_call>`` blocks in the output come back as OpenAI ``tool_calls`` (streamed and not),
a conversation carrying earlier calls and tool answers renders, and what cannot be honoured is a 400."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from specdec.server.tools import ToolTextFilter, parse_tool_calls
from tests.test_server import launch, serving

#: a Hermes-style template in the shape of Qwen2.5's (its own text, shorter): tools in the system
#: turn, earlier calls as <tool_call> blocks, tool answers as <tool_response> blocks
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "Answer a call as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- elif message.tool_calls %}<|im_start|>assistant{% for call in message.tool_calls %}\n<tool_call>\n"
    "{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
#: forces the tiny random model's answer to be a call (vLLM's structured_outputs regex)
CALL_REGEX = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)"\}\}\n</tool_call>'
ASK = [{"role": "user", "content": "weather in Paris?"}]


def test_parse_tool_calls_takes_well_formed_blocks_and_leaves_the_rest():
    text = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me look."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("f", {"x": 1}), ("g", {})]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')[0] is None
    for malformed in ("<tool_call>{not json}</tool_call>", '<tool_call>{"arguments": {}}</tool_call>', "no call at all"):
        assert parse_tool_calls(malformed) == (malformed, [])


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    assert [c["function"]["name"] for c in parse_tool_calls(text)[1]] == ["f", "g"]
    content, calls = parse_tool_calls(text, parallel=False)
    assert content is None and [c["function"]["name"] for c in calls] == ["f"]  # the other dropped, not content
    bare = '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]'
    assert [c["function"]["name"] for c in parse_tool_calls(bare, frozenset({"a", "b"}), parallel=False)[1]] == ["a"]


@pytest.mark.parametrize("parallel", [None, True, False])
def test_a_forced_answer_may_make_several_calls_unless_parallel_calls_are_off(parallel):
    """OpenAI's ``required``: one call or more (parallel_tool_calls defaults to true); false: one."""
    pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from specdec.server.schemas import ChatCompletionRequest
    from specdec.server.tools import forced_call

    req = ChatCompletionRequest(messages=ASK, tools=[WEATHER, DAY], tool_choice="required", parallel_tool_calls=parallel)
    grammar = forced_call(req).grammar
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    day = '<tool_call>\n{"name": "get_day", "arguments": {"offset": 1}}\n</tool_call>'
    assert accepts(grammar, weather) and accepts(grammar, day)
    assert accepts(grammar, weather + "\n" + day + "\n" + weather) is (parallel is not False)
    for wrong in (weather + "\n", weather + day, "Sure. " + weather, weather.replace("\"Paris\"", "3")):
        assert not accepts(grammar, wrong)
    # a parameter called "root" stays a literal when the root rule is renamed
    files = {"type": "function", "function": {"name": "list_files", "parameters": {
        "type": "object", "properties": {"root": {"type": "string"}}, "required": ["root"]}}}
    req = ChatCompletionRequest(messages=ASK, tools=[files], tool_choice="required", parallel_tool_calls=parallel)
    listing = '<tool_call>\n{"name": "list_files", "arguments": {"root": "/tmp"}}\n</tool_call>'
    assert accepts(forced_call(req).grammar, listing) and not accepts(forced_call(req).grammar, listing.replace("root", "rot"))


def test_a_bare_json_call_counts_only_when_it_names_a_tool():
    """What small models write instead of tags (Qwen2.5-Coder-1.5B: a ```json fence)."""
    fenced = '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n```'
    content, [call] = parse_tool_calls(fenced, frozenset({"get_weather"}))
    assert content is None and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert len(parse_tool_calls('[{"name": "a", "arguments": {}}, {"name": "b"}]', frozenset({"a", "b"}))[1]) == 2
    for not_a_call in (fenced.replace("get_weather", "other"), '{"name": "Ann", "age": 3}', 'x {"name": "get_weather"}'):
        assert parse_tool_calls(not_a_call, frozenset({"get_weather"})) == (not_a_call, [])
    held = ToolTextFilter(frozenset({"get_weather"}))
    assert held.push("```js") == "" and held.push('on\n{"name"') == ""  # may be a bare call: held to the end
    assert held.flush(called=False) == '```json\n{"name"'
    prose = ToolTextFilter()
    assert prose.push(" ") == "" and prose.push("Hi") == " Hi"


def test_a_call_cut_off_by_max_tokens_is_not_content_and_the_answer_ends_by_length():
    """A second call cut by max_tokens left '<tool_call>\n{"name": …' in content and finish_reason said
    tool_calls; the complete calls are kept, the open one dropped (vLLM's parsers), and the reason is length."""
    from specdec.server.tools import RequestTools

    text = 'Sure.\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n<tool_call>\n{"name": "g", "argu'
    content, calls = parse_tool_calls(text)
    assert content == "Sure." and [c["function"]["name"] for c in calls] == ["f"]
    # the only call cut by max_tokens: nothing of its markup (the README's promise; it was all content)
    assert parse_tool_calls('<tool_call>{"name": "g", "argu', cut=True) == ("", [])
    assert parse_tool_calls('Checking.\n<tool_call>\n{"name": "g"', cut=True) == ("Checking.", [])
    assert parse_tool_calls("<tool_call>oops</tool_call>") == ("<tool_call>oops</tool_call>", [])  # closed: text
    # not cut: prose naming the tag keeps all its text; a whole call without its closing tag (a stop string) is a call
    assert parse_tool_calls("Sure: use <tool_call> tags like so") == ("Sure: use <tool_call> tags like so", [])
    content, [call] = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n')
    assert content is None and call["function"]["name"] == "f"
    tools, named = RequestTools(frozenset({"f"})), RequestTools(frozenset({"f"}), named=True)
    assert tools.finish_reason("length", True) == "length" and tools.finish_reason("stop", True) == "tool_calls"
    assert named.finish_reason("stop", True) == "stop" and tools.finish_reason("stop", False) == "stop"
    assert tools.finish_reason(None, False) is None  # a chunk before the last


def test_a_code_answer_streams_though_tools_were_sent():
    """Every answer opening with a code fence was held to its end when tools were sent (a coder model's usual
    answer): only a ```json or bare fence can still be a tagless call."""
    from specdec.server.tools import may_be_bare_call

    for held in ("", "`", "```", "```js", "```json", "```json\n", "```json\n{", "```\n[", "{", " [", "```{"):
        assert may_be_bare_call(held.lstrip()), held
    for free in ("```python", "```py\n", "```json\ndef", "```\nimport os", "Sure", "```jsonl"):
        assert not may_be_bare_call(free), free
    code = ToolTextFilter(frozenset({"get_weather"}))
    assert code.push("```") == "" and code.push("python\n") == "```python\n" and code.push("def f") == "def f"


def test_the_stream_filter_holds_back_what_may_be_a_call():
    held = ToolTextFilter()
    assert held.push("Sure <tool") == "Sure "  # "<tool" may open a call: it waits
    assert held.push("s are fun ") == "<tools are fun "  # it did not
    assert held.push("x <tool_call>{") == "x "
    assert held.push('"name": "f"}</tool_call>') == ""
    assert held.flush(called=True) == ""
    after = ToolTextFilter()
    after.push('<tool_call>{"name": "f", "arguments": {}}</tool_call> done')
    assert after.flush(called=True) == "done"  # as the non-streamed answer's content
    malformed = ToolTextFilter()
    malformed.push("<tool_call>oops</tool_call>")
    assert malformed.flush(called=False) == "<tool_call>oops</tool_call>"  # no call: it is content after all
    cut = ToolTextFilter()
    assert cut.push('Let me check.<tool_call>\n{"name": "') == "Let me check."
    assert cut.flush(called=False, cut=True) == ""  # a call cut by max_tokens: its markup is not content, streamed or not
    prose = ToolTextFilter()
    assert prose.push("Use <tool_call> tags") == "Use "
    assert prose.flush(called=False) == "<tool_call> tags"  # not cut: the tag named in prose is text


@pytest.fixture(scope="module")
def tool_server(tiny_dirs, tmp_path_factory):
    """A server of the tiny target with a tool-aware chat template (the stock tiny one's is CHATML,
    which ignores tools: test_a_template_without_tools_refuses_them)."""
    model = tmp_path_factory.mktemp("tools") / "target"
    shutil.copytree(tiny_dirs["target"], model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": TOOL_TEMPLATE}))
    with serving(launch("--model", str(model), "--draft-model", str(tiny_dirs["draft"]), "--dtype", "float32",
                        "--quantize", "none", "--served-model-name", "tiny", "--num-speculative-tokens", "3")) as base:
        yield base


def chat(base: str, **body) -> httpx.Response:  # noqa: ANN003
    return httpx.post(f"{base}/v1/chat/completions", timeout=120,
                      json={"model": "tiny", "messages": ASK, "max_tokens": 160, "temperature": 0, **body})


def test_tools_reach_the_prompt_and_calls_come_back_as_tool_calls(tool_server):
    pytest.importorskip("xgrammar")
    without = chat(tool_server, max_tokens=4).json()
    forced = {"structured_outputs": {"regex": CALL_REGEX}}
    answer = chat(tool_server, tools=[WEATHER], **forced).json()
    assert answer["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"] + 20  # the tool's schema is in the prompt
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
    from openai import OpenAI  # the official client reads the answer as a call too

    client = OpenAI(base_url=f"{tool_server}/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=160, temperature=0,
                                         extra_body=forced)
    assert out.choices[0].finish_reason == "tool_calls" and out.choices[0].message.tool_calls[0].function.name == "get_weather"
    # the same request without tools: the text is content, not a call
    plain = chat(tool_server, **forced).json()["choices"][0]
    assert plain["finish_reason"] != "tool_calls" and plain["message"]["content"].startswith("<tool_call>")
    # streamed: no content from the call leaks, the call arrives in the last chunk
    events = [json.loads(line[6:]) for line in chat(tool_server, tools=[WEATHER], stream=True, **forced).text.splitlines()
              if line.startswith("data: {")]
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    last = events[-1]["choices"][0]
    assert "<tool_call>" not in streamed and last["finish_reason"] == "tool_calls"
    assert last["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
    # held-back text sends nothing: only the first chunk (the role's) has empty content
    assert [e["choices"][0]["delta"] for e in events if e["choices"] and e["choices"][0]["delta"] == {"content": ""}] == []
    # the conversation goes on: the call and the tool's answer are sent back and rendered
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "clear"}'}]
    follow_up = chat(tool_server, messages=history, tools=[WEATHER], max_tokens=8)
    assert follow_up.status_code == 200, follow_up.text
    assert follow_up.json()["usage"]["prompt_tokens"] > answer["usage"]["prompt_tokens"]


def test_parallel_tool_calls_false_answers_with_the_first_call_streamed_or_not(tool_server):
    pytest.importorskip("xgrammar")
    two_calls = {"structured_outputs": {"regex": CALL_REGEX + "\n" + CALL_REGEX}}
    both = chat(tool_server, tools=[WEATHER], **two_calls).json()["choices"][0]["message"]["tool_calls"]
    assert len(both) == 2
    first = chat(tool_server, tools=[WEATHER], parallel_tool_calls=False, **two_calls).json()["choices"][0]
    assert first["finish_reason"] == "tool_calls" and first["message"]["content"] is None
    assert [call["function"] for call in first["message"]["tool_calls"]] == [both[0]["function"]]
    events = [json.loads(line[6:]) for line in chat(tool_server, tools=[WEATHER], parallel_tool_calls=False, stream=True,
                                                    **two_calls).text.splitlines() if line.startswith("data: {")]
    last = events[-1]["choices"][0]
    assert [call["function"] for call in last["delta"]["tool_calls"]] == [both[0]["function"]]
    assert not "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])


def test_tool_choice_none_leaves_the_tools_out(tool_server):
    none = chat(tool_server, tools=[WEATHER], tool_choice="none", max_tokens=4).json()
    assert none["usage"]["prompt_tokens"] == chat(tool_server, max_tokens=4).json()["usage"]["prompt_tokens"]


TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": False}}}
DAY = {"type": "function", "function": {"name": "get_day", "parameters": {
    "type": "object", "properties": {"offset": {"enum": [0, 1]}}, "required": ["offset"], "additionalProperties": False}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tool_choice_required_or_named_constrains_the_answer_to_a_call(tool_server, choice):
    """The tiny random model would never write a call: the grammar makes it one, its arguments
    following the tool's schema — speculative and plain alike."""
    pytest.importorskip("xgrammar")
    answers = []
    for speculative in ({}, None):
        # (bounded arguments: the tiny model's context is 512 tokens, the tools take ~300 of them)
        # (one call: under "required" the random model would go on calling until max_tokens cut it: "length")
        answer = chat(tool_server, tools=[DAY, TIME], tool_choice=choice, speculative=speculative, max_tokens=120,
                      parallel_tool_calls=False).json()
        choice_ = answer["choices"][0]
        # OpenAI: a call the request named ends with "stop"; "required" lets the model choose: "tool_calls"
        assert choice_["finish_reason"] == ("stop" if isinstance(choice, dict) else "tool_calls"), answer
        [call] = choice_["message"]["tool_calls"]
        arguments = json.loads(call["function"]["arguments"])
        if isinstance(choice, dict):
            assert call["function"]["name"] == "get_time" and arguments["zone"] in ("UTC", "CET")
        answers.append((call["function"]["name"], arguments))
    assert answers[0] == answers[1]


@pytest.mark.parametrize("body,fragment", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "already constrains"),
    ({"tools": [WEATHER], "tool_choice": "required", "guided_json": {"type": "object"}}, "already constrains"),
    ({"tool_choice": "required"}, "the request has no tools"),
    ({"tools": [WEATHER, WEATHER]}, "each function needs a name of its own"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, "arguments must be JSON text"),
    ({"messages": [{"role": "user", "content": None}]}, "only an assistant message with tool_calls may omit it"),
    ({"messages": []}, "messages must not be empty"),
    # a schema that is none, whatever tool_choice says (under auto it went into the prompt unchecked)
    *[({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}], **choice},
       "tools: the parameters of 'f' are not a JSON Schema: 'bogus' is not valid") for choice in
      ({"tool_choice": "required"}, {}, {"tool_choice": "none"})],
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "city"}}}]},
     "'city' is not of type 'array' (at required)"),
    ({"tools": [{"type": "function", "function": {"name": "get weather!"}}]}, "tools.0.function.name"),  # OpenAI's pattern
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$schema": ["x"]}}}]},
     "$schema must be a string"),  # jsonschema's lookup raised TypeError: a 500
    ({"messages": [{"role": "user", "content": "Weather?"}, {"role": "tool", "content": "sunny"}]},
     "messages.1.tool_call_id: a tool message needs the id of the call it answers"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}}}],
      "tool_choice": "required"}, "tools: the parameters schema of 'f' uses properties.tags.uniqueItems, which the grammar engine"),
])
def test_what_cannot_be_honoured_is_a_400(tool_server, body, fragment):
    response = chat(tool_server, **body)
    assert response.status_code == 400 and fragment in response.json()["error"]["message"], response.text
    assert httpx.get(f"{tool_server}/health").status_code == 200


def test_a_template_without_tools_refuses_them(tiny_dirs):
    with serving(launch("--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none",
                        "--served-model-name", "tiny")) as base:
        response = chat(base, tools=[WEATHER])
        assert response.status_code == 400 and "does not describe tools" in response.json()["error"]["message"]


@pytest.mark.slow
def test_the_real_default_model_calls_a_tool():
    """Qwen2.5-Coder-1.5B with the draft (the server's default drafter): its own chat template gets
    the tool, and its answer parses as a call to it."""
    import specdec

    target = specdec.load_model("qwen2.5-coder-1.5b", quantize="int8")
    draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
    ids = target.tokenizer.apply_chat_template([{"role": "user", "content": "What's the weather like in Paris right now?"}],
                                              tools=[WEATHER])
    result = specdec.generate(target, ids, specdec.SamplingParams(temperature=0, max_tokens=64), draft=draft)
    content, [call] = parse_tool_calls(result.text, frozenset({"get_weather"}))
    assert call["function"]["name"] == "get_weather" and "Paris" in json.loads(call["function"]["arguments"]).values()


def test_tokenize_counts_what_the_chat_endpoint_reads_and_detokenize_inverts(tool_server):
    """vLLM's /tokenize and /detokenize: a chat request's count (tools included) is its prompt_tokens."""
    answer = chat(tool_server, tools=[WEATHER], max_tokens=2).json()
    counted = httpx.post(f"{tool_server}/tokenize", json={"model": "tiny", "messages": ASK, "tools": [WEATHER]}).json()
    assert counted["count"] == answer["usage"]["prompt_tokens"] == len(counted["tokens"])
    assert counted["max_model_len"] == 512
    text = httpx.post(f"{tool_server}/tokenize", json={"prompt": "def f(x):"}).json()
    back = httpx.post(f"{tool_server}/detokenize", json={"tokens": text["tokens"]}).json()
    assert back == {"prompt": "def f(x):"}
    for path, body, fragment in (("/tokenize", {"prompt": "x", "messages": ASK}, "not both"), ("/tokenize", {}, "not both"),
                                 ("/tokenize", {"messages": []}, "messages must not be empty"),
                                 ("/detokenize", {"tokens": [10**7]}, "tokens must be in"),
                                 ("/detokenize", {"tokens": "abc"}, "tokens")):
        response = httpx.post(f"{tool_server}{path}", json=body)
        assert response.status_code == 400 and fragment in response.json()["error"]["message"], response.text


def test_developer_messages_are_system_messages_and_a_final_message_can_be_continued(tool_server):
    """OpenAI's 'developer' role is the system turn (Qwen's template dropped it: the instruction was lost);
    vLLM's continue_final_message prefills the answer instead of opening a new turn."""
    def ids(**body):  # noqa: ANN003
        answer = chat(tool_server, max_tokens=1, logprobs=False, **body)
        assert answer.status_code == 200, answer.text
        return answer.json()["usage"]["prompt_tokens"]

    as_system = ids(messages=[{"role": "system", "content": "Be terse"}, *ASK])
    assert ids(messages=[{"role": "developer", "content": "Be terse"}, *ASK]) == as_system
    opened = [*ASK, {"role": "assistant", "content": "It is"}]
    continued = ids(messages=opened, continue_final_message=True, add_generation_prompt=False)
    new_turn = ids(messages=opened)
    assert continued < new_turn  # no end of the assistant turn, no new assistant header
    for body, fragment in (({"messages": opened, "continue_final_message": True}, "add_generation_prompt false"),
                           ({"continue_final_message": True, "add_generation_prompt": False}, "assistant message last")):
        response = chat(tool_server, **body)
        assert response.status_code == 400 and fragment in response.json()["error"]["message"], response.text


def test_chat_echo_puts_the_continued_message_first_streamed_or_not(tool_server):
    """vLLM's chat ``echo``: where the answer continues the last message, that message's text comes first in the
    content (it was read and ignored); a new turn echoes nothing."""
    import json

    opened = [*ASK, {"role": "assistant", "content": "It is"}]
    body = {"messages": opened, "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 6,
            "ignore_eos": True}
    plain = chat(tool_server, **body).json()["choices"][0]["message"]["content"]
    echoed = chat(tool_server, echo=True, **body).json()["choices"][0]["message"]["content"]
    assert echoed == "It is" + plain
    with httpx.stream("POST", f"{tool_server}/v1/chat/completions", timeout=120,
                      json={"model": "tiny", "temperature": 0, "stream": True, "echo": True, **body}) as response:
        deltas = [json.loads(line[5:])["choices"][0]["delta"] for line in response.iter_lines()
                  if line.startswith("data:") and "[DONE]" not in line]
    assert "".join(d.get("content") or "" for d in deltas) == echoed
    new_turn = chat(tool_server, echo=True, max_tokens=6, ignore_eos=True).json()["choices"][0]["message"]["content"]
    assert new_turn == chat(tool_server, max_tokens=6, ignore_eos=True).json()["choices"][0]["message"]["content"]
    # vLLM's rule: an assistant message last is echoed before a new assistant turn too
    after = chat(tool_server, echo=True, messages=opened, max_tokens=6, ignore_eos=True).json()["choices"][0]["message"]
    assert after["content"] == "It is" + chat(tool_server, messages=opened, max_tokens=6, ignore_eos=True).json()[
        "choices"][0]["message"]["content"]
    # with logprobs and prompt_logprobs (a completions-only merge of echoed prompt scores was a KeyError: a 500)
    scored = chat(tool_server, echo=True, logprobs=True, prompt_logprobs=0, **body)
    assert scored.status_code == 200 and scored.json()["choices"][0]["message"]["content"] == echoed, scored.text


def test_vllm_guided_fields_constrain_like_structured_outputs(tool_server):
    """vLLM's older guided_choice/guided_regex/… were accepted and ignored: the answer is now constrained."""
    pytest.importorskip("xgrammar")
    answer = chat(tool_server, guided_choice=["yes", "no"], max_tokens=8).json()
    assert answer["choices"][0]["message"]["content"] in ("yes", "no"), answer
    both = chat(tool_server, guided_choice=["yes"], structured_outputs={"choice": ["no"]})
    assert both.status_code == 400 and "not both" in both.json()["error"]["message"]
