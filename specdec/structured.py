"""Structured output: constrain generation to a JSON schema, any JSON object, a regex, a list of
choices or an EBNF grammar — exactly, under speculation too.

The grammar engine is `xgrammar <https://github.com/mlc-ai/xgrammar>`_ (the ``structured`` extra),
chosen over ``outlines-core`` after measuring both on Qwen2.5's 151k-token vocabulary: xgrammar
compiled a 3-field JSON schema in 0.03 s (outlines-core built its index in 0.5 s), fills a token
mask in ~20 µs, takes JSON schema, free-form JSON, regex *and* EBNF (outlines-core: regex only, so
no ``json_object``), and rolls its matcher back token by token, which speculation needs.

How it composes with speculation (the output distribution is exactly the constrained target's):

* one :class:`GrammarConstraint` per request follows the committed tokens and, during a round,
  the drafted ones; it gives the allowed-token mask after any drafted prefix;
* the target's verification rows are masked (disallowed logits → -inf) before the shared
  logits → probabilities transform, so p is the constrained target distribution at every position;
* model drafters mask their own logits with the same masks before sampling, so q is constrained
  the same way and their drafts are always grammatical;
* a drafted token the grammar refuses (a suffix table, n-gram lookup …) ends the draft: a
  deterministic draft is cut before it (its rejection would be certain, and the residual
  p − onehot(d) is then p itself); a draft sampled from some q keeps that one token, whose rejection
  is certain (p(d) = 0) and whose residual max(p − q, 0) must be sampled from to stay exact.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

import torch

from specdec.errors import SpecdecError, StructuredOutputError
from specdec.schema_checks import refuse_unenforced, schema_problem

if TYPE_CHECKING:
    from specdec.tokenizer import Tokenizer

INSTALL_HINT = "structured output needs xgrammar: pip install 'specdec[structured]'"


def available() -> bool:
    """True when the grammar engine (the ``structured`` extra) is installed."""
    import importlib.util

    return importlib.util.find_spec("xgrammar") is not None


def schema_text(schema: dict[str, Any] | bool | str) -> str:
    """A JSON Schema given as an object (or ``true``/``false``) or already as JSON text → JSON text."""
    return schema if isinstance(schema, str) else json.dumps(schema)


@dataclass(frozen=True)
class StructuredOutput:
    """What the output must match; exactly one field is set.

    ``json_schema``: a JSON Schema (JSON text, or a dict / bool kept as its JSON text). ``json_object``:
    any JSON value that is an object. ``regex``: the whole output matches it. ``choice``: the output is
    one of these strings. ``grammar``: an EBNF grammar (xgrammar's dialect, GBNF-like, root rule ``root``).
    """

    json_schema: str | dict[str, Any] | bool | None = None  # kept as JSON text
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.json_schema, (dict, bool)):  # the schema as an object: what a pydantic user has in hand
            try:
                object.__setattr__(self, "json_schema", schema_text(self.json_schema))
            except (TypeError, ValueError) as exc:  # a set, a non-string key …
                raise StructuredOutputError(f"json_schema is not JSON: {exc}") from None
        given = [name for name in ("json_schema", "regex", "choice", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise StructuredOutputError(f"structured output takes exactly one of json_schema, json_object, regex, choice, "
                               f"grammar; got {given or 'none'}")
        if self.json_schema is not None:
            try:
                schema = json.loads(self.json_schema)
            except (TypeError, ValueError) as exc:
                raise StructuredOutputError(f"json_schema is not valid JSON: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise StructuredOutputError("json_schema must be a JSON object (a JSON Schema)")
            problem = schema_problem(schema) if isinstance(schema, dict) else None
            if problem is not None:
                raise StructuredOutputError(f"json_schema is not a JSON Schema: {problem}")
            refuse_unenforced("json_schema", schema)
        if self.choice is not None and (not self.choice or any(not isinstance(c, str) or not c for c in self.choice)):
            raise StructuredOutputError("choice must be a non-empty list of non-empty strings")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise StructuredOutputError(f"{name} must be a non-empty string")

    @classmethod
    def from_schema(cls, schema: dict[str, Any] | bool | str) -> "StructuredOutput":
        return cls(json_schema=schema_text(schema))

    @property
    def kind(self) -> str:
        """The one field that is set (for logs and metrics)."""
        return "json_object" if self.json_object else next(
            name for name in ("json_schema", "regex", "choice", "grammar") if getattr(self, name) is not None)


def _xgrammar() -> Any:
    """The grammar engine module, or the install hint as a :class:`SpecdecError`."""
    try:
        import xgrammar
    except ImportError:
        raise SpecdecError(INSTALL_HINT) from None
    return xgrammar


@lru_cache(maxsize=8)
def _compiler(tokenizer: "Tokenizer", vocab_size: int) -> Any:
    """One xgrammar compiler per (tokenizer, model vocabulary): building its token table takes ~0.7 s
    for a 151k vocabulary, and the compiler caches every grammar it compiled."""
    xgrammar = _xgrammar()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer.hf, vocab_size=vocab_size,
                                                   stop_token_ids=sorted(tokenizer.stop_token_ids))
    return xgrammar.GrammarCompiler(info, max_threads=1)


def compile_for_vocab(spec: StructuredOutput, tokens: list[str], stop_token_ids: list[int]) -> Any:
    """Compile against a raw vocabulary (token i is the string ``tokens[i]``): the tiny-model
    certificate (:mod:`specdec.certify`) constrains an 8-token model this way."""
    xgrammar = _xgrammar()
    info = xgrammar.TokenizerInfo(tokens, vocab_type=xgrammar.VocabType.RAW, vocab_size=len(tokens),
                                  stop_token_ids=stop_token_ids)
    return _compile(xgrammar.GrammarCompiler(info, max_threads=1), spec)


def compile_grammar(spec: StructuredOutput, tokenizer: "Tokenizer", vocab_size: int) -> Any:
    """``spec`` → an xgrammar ``CompiledGrammar`` for this tokenizer; a bad schema, regex or grammar
    is a :class:`SpecdecError` that says which."""
    return _compile(_compiler(tokenizer, vocab_size), spec)


def _compile(compiler: Any, spec: StructuredOutput) -> Any:
    try:
        if spec.json_schema is not None:
            # no free whitespace between JSON tokens: a small model can otherwise emit spaces forever
            return compiler.compile_json_schema(spec.json_schema, any_whitespace=False)
        if spec.json_object:
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if spec.regex is not None:
            return compiler.compile_regex(spec.regex)
        if spec.choice is not None:
            return compiler.compile_regex("|".join(re.escape(choice) for choice in spec.choice))
        return compiler.compile_grammar(spec.grammar)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise _invalid(spec, exc) from None


def check_syntax(spec: StructuredOutput) -> None:
    """Parse ``spec``'s schema, regex or grammar without a tokenizer: the CLI refuses a bad one before
    loading a model (it failed ~40 s later, after the 1.5B target had loaded). No-op without xgrammar."""
    if not available():
        return
    grammar = _xgrammar().Grammar
    try:
        if spec.json_schema is not None:
            grammar.from_json_schema(spec.json_schema, any_whitespace=False)
        elif spec.regex is not None:
            grammar.from_regex(spec.regex)
        elif spec.grammar is not None:
            grammar.from_ebnf(spec.grammar)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise _invalid(spec, exc) from None


def _invalid(spec: StructuredOutput, exc: Exception) -> StructuredOutputError:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # xgrammar's C++ log prefix ("[08:46:14] /project/cpp/json_schema_converter.cc:5082: ") is not the user's business
    message = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", message)
    return StructuredOutputError(f"invalid {spec.kind}: {message}")


class GrammarConstraint:
    """One request's position in its grammar: the committed tokens plus, during a round, a drafted
    prefix. Every mask is an xgrammar bitmask row (``int32 [ceil(V / 32)]``, bit set = allowed).

    Invariant: the matcher has accepted the committed tokens and then ``self.pushed``;
    ``self.rows[i]`` is the mask after ``pushed[:i]``, so ``len(rows) == len(pushed) + 1``.
    """

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar

        self._xgr = xgrammar
        self.matcher = xgrammar.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.pushed: list[int] = []
        self.rows: list[torch.Tensor] = [self._fill()]

    @classmethod
    def build(cls, spec: StructuredOutput, tokenizer: "Tokenizer", vocab_size: int) -> "GrammarConstraint":
        return cls(compile_grammar(spec, tokenizer, vocab_size), vocab_size)

    @property
    def finished(self) -> bool:
        """The committed tokens completed the grammar: its stop token was accepted, or nothing may
        follow (a complete grammar over a vocabulary without stop tokens)."""
        return not self.pushed and (self.matcher.is_terminated() or not bool(self.rows[0].any()))

    def _fill(self) -> torch.Tensor:
        row = self._xgr.allocate_token_bitmask(1, self.vocab_size)
        if self.matcher.is_terminated():
            row.zero_()  # nothing may follow a completed grammar
        else:
            self.matcher.fill_next_token_bitmask(row, 0)
        return row[0]

    def _goto(self, tokens: Sequence[int]) -> int:
        """Move to committed + ``tokens``; return how many leading tokens the grammar accepts (the
        matcher stops before the first one it refuses)."""
        common = 0
        while common < min(len(tokens), len(self.pushed)) and tokens[common] == self.pushed[common]:
            common += 1
        if len(self.pushed) > common:
            self.matcher.rollback(len(self.pushed) - common)
            del self.pushed[common:]
            del self.rows[common + 1 :]
        for token in tokens[common:]:
            if self.matcher.is_terminated() or not self.matcher.accept_token(int(token)):
                break
            self.pushed.append(int(token))
            self.rows.append(self._fill())
        return len(self.pushed)

    def draft_cut(self, tokens: Sequence[int], sampled: bool) -> tuple[int, int]:
        """A draft's ``(tokens to verify, grammatical prefix)``. At the first token the grammar
        refuses, a deterministic draft is cut before it; a draft sampled from a distribution q keeps
        it (see the module docstring: its certain rejection samples max(p − q, 0), which is what makes
        the round exact — cutting it would sample p instead)."""
        grammatical = self._goto(tokens)
        return (grammatical + 1 if sampled and grammatical < len(tokens) else grammatical), grammatical

    def forced_tokens(self, drafted: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens after ``drafted`` (all grammatical) that the grammar alone decides:
        while its mask allows exactly one token, that token. The target's masked distribution is then
        a point mass, so verification accepts it whatever the logits — appended to a draft it is a
        free, certain token (jump-forward decoding, verified in the same forward)."""
        if self._goto(drafted) != len(drafted):
            return []
        forced: list[int] = []
        while len(forced) < limit and not self.matcher.is_terminated():
            words = self.rows[-1].nonzero()
            if words.numel() != 1:
                break
            index = int(words[0, 0])
            word = int(self.rows[-1][index]) & 0xFFFFFFFF
            if word & (word - 1):  # more than one bit: a choice
                break
            token = index * 32 + word.bit_length() - 1
            if token >= self.vocab_size or not self.matcher.accept_token(token):
                break
            self.pushed.append(token)
            self.rows.append(self._fill())
            forced.append(token)
        return forced

    def mask_logits(self, logits: torch.Tensor, drafted: Sequence[int]) -> torch.Tensor | None:
        """``logits [V']`` (``V' <= V``: a draft may score a vocabulary prefix) after the committed
        tokens and ``drafted`` → a masked copy; None when ``drafted`` already left the grammar or
        nothing in ``V'`` is allowed (the drafter then stops drafting)."""
        if self._goto(drafted) != len(drafted):
            return None
        masked = self.apply(logits.unsqueeze(0), [self.rows[len(drafted)]])[0]
        return masked if bool(torch.isfinite(masked).any()) else None

    def mask_rows(self, logits: torch.Tensor, valid: int) -> torch.Tensor:
        """Verification logits ``[n, V]`` (row i follows the committed tokens and the first i drafted
        ones) → a masked copy. Rows past ``valid`` (the drafted prefix the grammar accepts) stay raw:
        they follow a refused token, whose rejection is certain, so they are never used."""
        rows = min(valid + 1, logits.shape[0])
        return self.apply(logits, self.rows[:rows])

    def apply(self, logits: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor:
        """Masked copy of ``logits [n, V']``: the first ``len(rows)`` rows get -inf where not allowed."""
        masked = logits.float().clone()
        bitmask = torch.stack(rows).to(masked.device)
        self._xgr.apply_token_bitmask_inplace(masked[: len(rows)], bitmask, vocab_size=min(masked.shape[-1], self.vocab_size))
        return masked

    def commit(self, tokens: Sequence[int]) -> int:
        """The engine commits ``tokens`` (chosen under the masks); returns how many belong to the
        output: all of them, or those up to the one that completed the grammar (a bonus token
        scored after the grammar's stop token is not part of it)."""
        accepted = self._goto(tokens)
        if accepted != len(tokens) and not self.matcher.is_terminated():
            raise RuntimeError(f"grammar refused committed tokens {list(tokens)}: a mask was not applied")
        self.pushed = []
        self.rows = self.rows[-1:]
        return accepted
