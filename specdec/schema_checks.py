"""What a JSON Schema asks that the grammar engine cannot hold an output to — checked before compiling.

xgrammar compiles some schemas into grammars that accept outputs breaking them (``[1, 1]`` under ``uniqueItems``,
any JSON for a remote ``$ref``, ``oneOf`` read as ``anyOf``): such a schema is refused with the path of what it
cannot enforce, as OpenAI's strict mode refuses those keywords, rather than answered with an output the user's own
validator rejects. And a schema that is not a JSON Schema by its metaschema (``"type": "objekt"``) is refused too.
"""

from __future__ import annotations

from typing import Any

from specdec.errors import StructuredOutputError


#: assertions xgrammar (0.2) compiles but does not enforce — its grammar accepts outputs that break them
#: (checked string by string: ``[1, 1]`` under uniqueItems, ``{"a": 1}`` under dependentRequired a→b …)
_UNENFORCED = ("uniqueItems", "contains", "minContains", "maxContains", "dependentRequired", "dependentSchemas",
               "dependencies", "if", "then", "else", "not")
#: where a schema holds further schemas: one schema, a list of them, or a name → schema map
_SUBSCHEMA = ("items", "additionalItems", "additionalProperties", "unevaluatedItems", "unevaluatedProperties",
              "propertyNames", "contains", "not", "if", "then", "else")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


#: keywords that assert nothing (annotations, containers of definitions): beside ``$ref``/``anyOf``/``oneOf`` they are
#: fine, where xgrammar drops every other sibling of those (``"type": "integer"`` beside an anyOf, ``"minimum"``
#: beside a ``$ref``: outputs breaking them were accepted)
_ANNOTATIONS = frozenset(("title", "description", "default", "examples", "$comment", "$defs", "definitions", "$schema",
                          "$id", "deprecated", "readOnly", "writeOnly", "discriminator"))


def unenforced_keywords(schema: Any, path: str = "", root: Any = None) -> list[str]:
    """Where ``schema`` asks for what the grammar cannot enforce, as dotted paths (``properties.tags.uniqueItems``).

    A constraint that compiles but is not enforced would let the output silently break the schema the
    user gave; a property *named* like a keyword is not one (only schema positions are read)."""
    if not isinstance(schema, dict):
        return []
    root = schema if root is None else root
    found = [f"{path}{key}" for key in _UNENFORCED if key in schema and not (key == "uniqueItems" and schema[key] is False)]
    if schema.get("type") == "number" or isinstance(schema.get("type"), list) and "number" in schema["type"]:
        found += [f"{path}multipleOf"] if "multipleOf" in schema else []  # xgrammar: "ignoring multipleOf"
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:  # xgrammar: "allOf with multiple options"
        found.append(f"{path}allOf")
    if isinstance(schema.get("$ref"), str) and not schema["$ref"].startswith("#"):  # a remote schema: compiled as any JSON
        found.append(f"{path}$ref (not a local #/... reference)")
    if isinstance(schema.get("oneOf"), list) and not _disjoint(schema["oneOf"], root):  # xgrammar reads it as anyOf
        found.append(f"{path}oneOf (branches that may overlap)")
    for combinator in ("$ref", "anyOf", "oneOf", "allOf"):  # every other assertion beside it is dropped, a second
        if combinator in schema:  # combinator too (an allOf of one schema beside "minimum": 5 accepted 3)
            found += [f"{path}{key} (beside {combinator})" for key in schema if key not in _ANNOTATIONS and key != combinator]
            break
    for key in _SUBSCHEMA:
        found += unenforced_keywords(schema.get(key), f"{path}{key}.", root)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for index, item in enumerate(schema[key]):
                found += unenforced_keywords(item, f"{path}{key}[{index}].", root)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, item in schema[key].items():
                found += unenforced_keywords(item, f"{path}{key}.{name}.", root)
    return found


def _disjoint(branches: list[Any], root: Any) -> bool:
    """Can no JSON value match two of ``branches``? Then oneOf means anyOf, which is what the grammar enforces. Proven
    pair by pair from the branches' types (integer is a number), or — a discriminated union, as pydantic writes one —
    a property every branch requires with a ``const``/``enum`` of values no other branch allows; else not proven."""
    resolved = [_local(branch, root) for branch in branches]
    return all(_types_apart(a, b) or _discriminated(a, b) for i, a in enumerate(resolved) for b in resolved[i + 1 :])


def _local(schema: Any, root: Any) -> Any:
    """A ``{"$ref": "#/$defs/X"}`` branch as the schema it points to (other schemas as they are)."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    target = root
    for part in ref[2:].split("/"):
        target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
    return target if isinstance(target, dict) else schema


def _json_types(schema: Any) -> set[str] | None:
    """The JSON types a schema allows, read from ``type`` (None: not stated, so anything)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else None
    if kinds is not None and "number" in kinds:
        kinds.add("integer")  # every integer is a number
    return kinds


def _types_apart(a: Any, b: Any) -> bool:
    types_a, types_b = _json_types(a), _json_types(b)
    return types_a is not None and types_b is not None and not types_a & types_b


def _discriminated(a: Any, b: Any) -> bool:
    def values(schema: Any, name: str) -> list | None:
        if not isinstance(schema, dict) or name not in (schema.get("required") or ()):
            return None
        prop = (schema.get("properties") or {}).get(name)
        if not isinstance(prop, dict):
            return None
        return [prop["const"]] if "const" in prop else prop.get("enum") if isinstance(prop.get("enum"), list) else None

    shared = set(a.get("required") or ()) & set(b.get("required") or ()) if isinstance(a, dict) and isinstance(b, dict) else set()
    for name in shared:
        left, right = values(a, name), values(b, name)
        if left is not None and right is not None and not any(x == y for x in left for y in right):
            return True
    return False


def schema_problem(schema: dict[str, Any] | None) -> str | None:
    """What makes ``schema`` not a JSON Schema by its metaschema (the draft its ``$schema`` names, else
    2020-12), or None. Under ``tool_choice: "auto"`` a tool's parameters were never checked: a typo such as
    ``"type": "objekt"`` went into the prompt, and a model asked to follow it; a response format's schema went to
    the grammar engine, which compiled ``{"$schema": ["x"]}`` as any object."""
    if schema is None:
        return None
    if not isinstance(schema.get("$schema", ""), str):  # jsonschema looks it up as a key: a list was a 500
        return "$schema must be a string (the URI of a JSON Schema draft)"
    try:
        from jsonschema import exceptions, validators
    except ImportError:  # an environment from before the serve extra named it: the grammar still checks forced calls
        return None

    try:
        validators.validator_for(schema, default=validators.Draft202012Validator).check_schema(schema)
    except exceptions.SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        return exc.message + (f" (at {where})" if where else "")
    return None


def refuse_unenforced(what: str, schema: Any) -> None:
    """Refuse a schema the grammar would enforce only in part (OpenAI's strict mode refuses them too)."""
    try:
        found = list(dict.fromkeys(unenforced_keywords(schema)))
    except (TypeError, AttributeError) as exc:  # malformed where the metaschema check did not run (no jsonschema)
        raise StructuredOutputError(f"{what} is not a JSON Schema: {exc}") from None
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise StructuredOutputError(f"{what} uses {shown}, which the grammar engine (xgrammar) cannot enforce: the output "
                           "could break it. Remove the keyword (and check that property of the output yourself)")
