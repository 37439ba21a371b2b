"""Structured output over HTTP: OpenAI's ``response_format`` (json_object, json_schema) and vLLM's
``structured_outputs`` (json, regex, choice, grammar) on a real `specdec serve`, speculative and plain
answers equal, streamed too; bad schemas are 400 error objects and the server stays up."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}, "count": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["color", "count"],
    "additionalProperties": False,
}


def chat(base: str, **body) -> httpx.Response:  # noqa: ANN003
    body = {"model": "tiny", "messages": [{"role": "user", "content": "a record please"}], "max_tokens": 64,
            "temperature": 0, **body}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)


def test_response_format_json_schema_with_the_openai_client(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA, "strict": True}}
    answers = []
    for speculative in ({}, None):  # the server's drafter, then plain decoding
        out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a record please"}],
                                             max_tokens=64, temperature=0, response_format=fmt,
                                             extra_body={"speculative": speculative})
        jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
        assert out.choices[0].finish_reason == "stop"
        answers.append(out.choices[0].message.content)
    assert answers[0] == answers[1]


def test_streamed_json_object_is_the_full_answer(server):
    full = chat(server, response_format={"type": "json_object"}, max_tokens=256).json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", f"{server}/v1/chat/completions", timeout=120, json={
        "model": "tiny", "messages": [{"role": "user", "content": "a record please"}], "max_tokens": 256,
        "temperature": 0, "stream": True, "response_format": {"type": "json_object"},
    }) as response:
        pieces = []
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                pieces.append(choice["delta"].get("content") or "")
    assert "".join(pieces) == full
    if full.endswith("}"):
        assert isinstance(json.loads(full), dict)


def test_structured_outputs_regex_choice_grammar_on_completions(server):
    def complete(constraint: dict) -> str:
        body = {"model": "tiny", "prompt": "answer:", "max_tokens": 48, "temperature": 0, "structured_outputs": constraint}
        response = httpx.post(f"{server}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    assert re.fullmatch(r"\d{3}-\d{4}", complete({"regex": r"\d{3}-\d{4}"}))
    assert complete({"choice": ["yes", "no"]}) in ("yes", "no")
    assert re.fullmatch(r"(ab)+", complete({"grammar": 'root ::= ("ab")+'}))
    jsonschema.validate(json.loads(complete({"json": SCHEMA})), SCHEMA)


@pytest.mark.parametrize("body,fragment", [
    ({"response_format": {"type": "json_schema"}}, "needs a json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "json_schema is not a JSON Schema: 'nonsense'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}}}}},
     "json_schema uses dependentRequired, which the grammar engine (xgrammar) cannot enforce"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "invalid regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
    ({"structured_outputs": {"grammar": "root ::= nothing_defined"}}, "invalid grammar"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "not both"),
    ({"guided_regex": "(unclosed"}, "invalid regex"),  # compiled in the job: named as sent
    ({"guided_choice": []}, "guided_choice: choice must be a non-empty list"),  # checked up front: named as sent too
])
def test_bad_constraints_are_400_and_the_server_stays_up(server, body, fragment):
    response = chat(server, **body)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]["message"]
    # the field that carried it (schema, regex and grammar errors named none)
    param = response.json()["error"]["param"] or ""
    sent = next((key for key in ("response_format", "structured_outputs", "guided_regex", "guided_choice") if key in body))
    assert param.split(".")[0] == sent, param
    assert chat(server, response_format={"type": "text"}, max_tokens=2).status_code == 200
