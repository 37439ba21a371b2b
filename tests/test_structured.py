"""Structured output (JSON schema, JSON object, regex, choice, grammar) composes exactly with speculation:
outputs match their constraint, greedy speculative == greedy plain under the same constraint, and the
sampled distribution is the constrained target's (χ², with a broken rule shown failing)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

import specdec
import specdec.structured as structured_module
from specdec.certify import distribution_check
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams
from specdec.structured import GrammarConstraint, StructuredOutput

pytest.importorskip("xgrammar")

# bounded, so even a random model completes it within max_tokens
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "count", "ok"],
    "additionalProperties": False,
}
METHODS = ["draft_model", "ngram", "suffix", "draft_suffix", "layer_skip", "early_exit"]


def run(target, draft, prompt, method, structured, **params):  # noqa: ANN001, ANN201
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=4) if method else None
    sampling = SamplingParams(**{"temperature": 0, "max_tokens": 64, "structured": structured, **params})
    return specdec.generate(target, prompt, sampling, draft=draft, spec=spec)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_json_schema_speculative_equals_plain_and_is_valid(tiny_target, tiny_draft, method):
    constraint = StructuredOutput.from_schema(SCHEMA)
    for prompt in ["def fibonacci(n):", "class Stack:"]:
        plain = run(tiny_target, None, prompt, None, constraint)
        spec = run(tiny_target, tiny_draft, prompt, method, constraint)
        assert spec.token_ids == plain.token_ids, (method, prompt)
        assert spec.finish_reason == plain.finish_reason == "stop"
        jsonschema.validate(json.loads(spec.text), SCHEMA)


def test_json_object_regex_choice_and_grammar_outputs_match(tiny_target, tiny_draft):
    out = run(tiny_target, tiny_draft, "x = ", "draft_model", StructuredOutput(json_object=True), max_tokens=200)
    if out.finish_reason == "stop":  # a random model may write a long object; a finished one parses
        assert isinstance(json.loads(out.text), dict)
    regex = r"[a-z]{2,6}@[a-z]{2,6}\.(com|org)"
    out = run(tiny_target, tiny_draft, "email: ", "ngram", StructuredOutput(regex=regex))
    assert re.fullmatch(regex, out.text) and out.finish_reason == "stop"
    out = run(tiny_target, tiny_draft, "pick: ", "suffix", StructuredOutput(choice=("yes", "no", "maybe")))
    assert out.text in ("yes", "no", "maybe")
    grammar = 'root ::= "def " name "(" name "):"\nname ::= [a-z] [a-z0-9_]*'
    out = run(tiny_target, tiny_draft, "code: ", "draft_model", StructuredOutput(grammar=grammar), max_tokens=200)
    if out.finish_reason == "stop":
        assert re.fullmatch(r"def [a-z][a-z0-9_]*\([a-z][a-z0-9_]*\):", out.text)


def test_sampled_outputs_are_valid_and_reproducible(tiny_target, tiny_draft):
    constraint = StructuredOutput.from_schema(SCHEMA)
    outs = [run(tiny_target, tiny_draft, "data:", "draft_model", constraint, temperature=1.0, seed=seed) for seed in range(6)]
    for out in outs:
        jsonschema.validate(json.loads(out.text), SCHEMA)
    again = run(tiny_target, tiny_draft, "data:", "draft_model", constraint, temperature=1.0, seed=0)
    assert again.token_ids == outs[0].token_ids


def test_a_completed_grammar_ends_the_request_even_with_ignore_eos(tiny_target, tiny_draft):
    out = run(tiny_target, tiny_draft, "pick: ", "draft_model", StructuredOutput(choice=("alpha", "beta")), ignore_eos=True)
    assert out.text in ("alpha", "beta") and out.finish_reason == "stop"


# The χ² certificate of constrained sampling for every drafter is tests/test_certify.py's "T=1,regex"
# configuration (DISTRIBUTION_CONFIGS); here, that the test has the power to catch a wrong rule.


def test_a_sampled_draft_cut_before_the_refused_token_fails_the_certificate(monkeypatch):
    """Why a sampled draft keeps the token the grammar refuses: with a q that is not masked (a drafter
    that ignores the grammar), cutting before it samples p where max(p - q, 0) is due. The engine's
    rule alone keeps such a drafter exact; the tempting shortcut is caught by the χ² test. (A regex
    with 8 outcomes that refuses most drafted tokens, so the bias is large; seed 1 is a model pair
    whose q differs enough from p at the refused positions for 2000 samples to show it.)"""
    import specdec.certify as certify

    real_resources = certify.DrafterResources

    def unmasked_drafter(**fields):  # noqa: ANN003, ANN202 - the drafter never sees the grammar
        return real_resources(**{**fields, "constraint": None})

    monkeypatch.setattr(certify, "DrafterResources", unmasked_drafter)
    params = SamplingParams(temperature=1.0, structured=StructuredOutput(regex="[bc][ef][ag]"))
    kept = distribution_check("draft_model", "T=1,[bc][ef][ag]", params, samples=2000, seed=1)
    assert kept.passed, kept.detail

    def cut_before(self, tokens, sampled):  # noqa: ANN001, ANN202
        grammatical = self._goto(tokens)
        return grammatical, grammatical

    monkeypatch.setattr(GrammarConstraint, "draft_cut", cut_before)
    cut = distribution_check("draft_model", "T=1,[bc][ef][ag]", params, samples=2000, seed=1)
    assert not cut.passed, cut.detail


def test_bad_constraints_are_clear_errors(tiny_target):
    with pytest.raises(SpecdecError, match="exactly one"):
        StructuredOutput()
    with pytest.raises(SpecdecError, match="exactly one"):
        StructuredOutput(regex="a", json_object=True)
    with pytest.raises(SpecdecError, match="not valid JSON"):
        StructuredOutput(json_schema="{nope")
    with pytest.raises(SpecdecError, match="choice"):
        StructuredOutput(choice=())
    with pytest.raises(SpecdecError, match="structured must be"):
        SamplingParams(structured={"type": "json_object"})
    with pytest.raises(SpecdecError, match="invalid regex"):
        run(tiny_target, None, "x", None, StructuredOutput(regex="(unclosed"))
    with pytest.raises(SpecdecError, match="invalid grammar"):
        run(tiny_target, None, "x", None, StructuredOutput(grammar="root ::= undefined_rule"))


#: each refused keyword, a schema using it, and an output that breaks it
UNENFORCED_CASES = [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}, "[2]"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}, "maxContains": 1}, "[1, 1]"),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}},
     '{"a": 1}'),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependentSchemas": {"a": {"required": ["b"]}}}, '{"a": 1}'),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "if": {"properties": {"a": {"const": 1}}, "required": ["a"]}, "then": {"required": ["b"]}}, '{"a": 1}'),
    ({"type": "integer", "not": {"const": 1}}, "1"),
    ({"type": "number", "multipleOf": 0.5}, "0.3"),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "1"),
    ({"$ref": "https://example.com/s.json"}, '"anything"'),  # a remote schema compiles to any JSON
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1"),  # overlapping branches: read as anyOf
    ({"anyOf": [{"type": "integer"}, {"type": "string"}], "type": "integer"}, '"s"'),  # siblings of anyOf are dropped
    ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "minimum": 5}, "1"),  # and of $ref
    ({"allOf": [{"type": "integer"}], "minimum": 5}, "3"),  # and of a one-schema allOf
    ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "anyOf": [{"type": "integer", "maximum": 2}]}, "5"),
]


@pytest.mark.parametrize("schema,breaking", UNENFORCED_CASES)
def test_a_schema_the_grammar_cannot_enforce_is_refused(schema, breaking):
    """The grammar really accepts the breaking output (so refusing is needed), and the schema is refused by name."""
    xgrammar = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    grammar = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    assert _is_grammar_accept_string(grammar, breaking), "xgrammar now enforces this: drop it from _UNENFORCED"
    with pytest.raises(SpecdecError, match="cannot enforce"):
        StructuredOutput.from_schema({"type": "object", "properties": {"field": schema}})


def test_unions_the_grammar_enforces_exactly_pass():
    """oneOf whose branches cannot overlap (types apart, or pydantic's discriminated union through $refs) means anyOf,
    which the grammar enforces; Optional fields (anyOf with null) and $refs carry annotations beside them."""
    from specdec.schema_checks import unenforced_keywords

    cat = {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind", "lives"]}
    dog = {"type": "object", "properties": {"kind": {"enum": ["dog", "puppy"]}}, "required": ["kind"]}
    schema = {"$defs": {"Cat": cat, "Dog": dog}, "type": "object", "properties": {
        "pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "title": "Pet"},
        "id": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Note"},
        "owner": {"$ref": "#/$defs/Cat", "description": "who"}}}
    assert unenforced_keywords(schema) == []
    dog["properties"]["kind"] = {"enum": ["dog", "cat"]}  # now a value both branches allow
    assert unenforced_keywords(schema) == ["properties.pet.oneOf (branches that may overlap)"]


def test_keywords_it_enforces_and_property_names_like_keywords_pass():
    from specdec.schema_checks import unenforced_keywords

    schema = {"type": "object", "properties": {"if": {"type": "string", "format": "email"}, "not": {"type": "integer", "multipleOf": 3},
                                               "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": False},
                                               "list": {"$ref": "#/$defs/p"}},
              "$defs": {"p": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}}
    assert unenforced_keywords(schema) == ["$defs.p.uniqueItems"]
    del schema["$defs"]["p"]["uniqueItems"]
    StructuredOutput.from_schema(schema)


def test_missing_grammar_engine_is_a_clear_error(tiny_target, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_xgrammar(name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if name == "xgrammar":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    structured_module._compiler.cache_clear()
    monkeypatch.setattr(builtins, "__import__", no_xgrammar)
    with pytest.raises(SpecdecError, match=r"pip install 'specdec\[structured\]'"):
        run(tiny_target, None, "x", None, StructuredOutput(json_object=True))
    monkeypatch.undo()
    structured_module._compiler.cache_clear()


def test_cli_generate_with_a_schema_file_and_a_regex(tiny_dirs, tmp_path, capsys):
    from specdec.cli import main

    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    base = ["--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]), "--dtype", "float32",
            "--quantize", "none", "--max-tokens", "64", "--compare-plain"]
    assert main(["generate", "data:", *base, "--json-schema", str(schema_file)]) == 0
    captured = capsys.readouterr()
    jsonschema.validate(json.loads(captured.out), SCHEMA)
    assert "identical text: yes" in captured.err
    assert main(["generate", "n:", *base, "--regex", r"\d{2}-\d{2}"]) == 0
    assert re.fullmatch(r"\d{2}-\d{2}", capsys.readouterr().out.strip())
    assert main(["generate", "n:", *base, "--regex", "(", "--max-tokens", "4"]) != 0
    assert "invalid regex" in capsys.readouterr().err


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reduced_draft_vocabulary_under_a_grammar(tiny_target, tiny_draft, temperature):
    """A draft scoring only ids < 256 masks its shorter logits row with the same grammar; greedy output
    is still plain decoding's, and sampled output is valid."""
    constraint = StructuredOutput.from_schema(SCHEMA)
    sampling = SamplingParams(temperature=temperature, seed=3, max_tokens=64, structured=constraint)
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=4, draft_vocab_size=256)
    out = specdec.generate(tiny_target, "data:", sampling, draft=tiny_draft, spec=spec)
    jsonschema.validate(json.loads(out.text), SCHEMA)
    if temperature == 0.0:
        assert out.token_ids == specdec.generate(tiny_target, "data:", sampling).token_ids


@pytest.mark.parametrize("method", [None, "draft_model", "ngram"])
def test_min_tokens_yields_to_a_completed_grammar(tiny_target, tiny_draft, method):
    """min_tokens banned the stop tokens where the grammar allowed nothing else: every logit -inf, argmax took token 0,
    and the grammar refused it — a RuntimeError (a server's 500) for json_schema or regex with a large min_tokens."""
    for structured in (StructuredOutput(choice=("alpha", "beta")), StructuredOutput(regex="[a-c]{2}")):
        out = run(tiny_target, tiny_draft, "pick: ", method, structured, min_tokens=40)
        plain = run(tiny_target, None, "pick: ", None, structured, min_tokens=40)
        assert out.token_ids == plain.token_ids and out.finish_reason == "stop"
        assert out.text in ("alpha", "beta") or re.fullmatch("[a-c]{2}", out.text)


def test_a_response_format_schema_is_checked_against_its_metaschema():
    """Tools' parameters were; a response format's schema went to the grammar engine, which compiled a list as $schema."""
    pytest.importorskip("jsonschema")
    with pytest.raises(SpecdecError, match=r"json_schema is not a JSON Schema: .*objekt"):
        StructuredOutput.from_schema({"type": "objekt"})
    with pytest.raises(SpecdecError, match=r"\$schema must be a string"):
        StructuredOutput.from_schema({"$schema": ["x"], "type": "object"})


def test_a_schema_object_is_taken_as_it_is_given():
    """StructuredOutput(json_schema={...}) — the dict a pydantic user has — was "not valid JSON: … not dict"."""
    given = StructuredOutput(json_schema=SCHEMA)
    assert given == StructuredOutput.from_schema(SCHEMA) and json.loads(given.json_schema) == SCHEMA
