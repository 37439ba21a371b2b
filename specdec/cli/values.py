"""Argument types the commands' flags share: counts, numbers, γ values, tree sizes — each a one-line
argparse error for a bad value (never a traceback), and each the one place its rule is written."""

from __future__ import annotations

import argparse
import json

from specdec.config import SPEC_TREE_WORDS
from specdec.errors import SpecdecError


def count_or_word(text: str, words: tuple[str, ...], minimum: int, what: str) -> int | str:
    """A flag that takes a count (>= ``minimum``) or one of ``words`` ('auto', 'off' …); one clear
    argparse error otherwise. The shape of --spec-tree, --prefill-chunk, --disable-speculation-above."""
    if text in words:
        return text
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        choices = ", ".join(repr(w) for w in words)
        raise argparse.ArgumentTypeError(f"expected {choices} or a number of {what} >= {minimum}, got {text!r}")
    return value


def speculation_limit_value(text: str) -> int | str:
    """``--disable-speculation-above`` (serve, bench): a count, ``auto`` or ``never``
    (:meth:`specdec.policy.BatchPolicy.from_setting`)."""
    return count_or_word(text, ("auto", "never"), 0, "requests")


def tree_value(text: str) -> str | int:
    """--spec-tree: 'off', 'auto', 'greedy' or a positive number of nodes."""
    return count_or_word(text, SPEC_TREE_WORDS, 1, "tree nodes")


def tree_values(text: str, flag: str = "--spec-trees") -> list[str | int]:
    """A comma-separated list of --spec-tree values ("off,auto,8"); a clear error for a bad one."""
    try:
        return [tree_value(part.strip()) for part in text.split(",") if part.strip()] or ["off"]
    except argparse.ArgumentTypeError as exc:
        raise SpecdecError(f"{flag}: {exc}") from None


def bounded_int(text: str, least: int, expected: str, most: int | None = None) -> int:
    """An integer flag in [least, most] (no upper bound where most is None), or argparse's one-line error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if most is not None and not least <= value <= most:
        raise argparse.ArgumentTypeError(f"must be in {least}..{most}, got {value}")
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    return bounded_int(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return bounded_int(text, 0, "an integer >= 0")


def seed_value(text: str) -> int:
    """A sampling seed: what torch.Generator.manual_seed takes without wrapping (SamplingParams' own
    message also names None, which a command line cannot type)."""
    return bounded_int(text, 0, "an integer >= 0", 2**63 - 1)


def number(text: str) -> float:
    """A number flag's value, or argparse's one-line error (callers check its range)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive_number(text: str) -> float:
    """A budget in minutes, a learning rate: a number > 0 (a zero training budget wrote an untrained head and
    exited 0; a negative rate was torch's traceback)."""
    value = number(text)
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def stats_interval(text: str) -> float:
    """--log-stats-interval: 0 (no lines) or at least 0.1 seconds (a tiny one was a busy loop flooding the log)."""
    value = number(text)
    if value != 0 and not 0.1 <= value < float("inf"):  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 (no lines) or at least 0.1 seconds, got {text}")
    return value


def default_max_tokens(text: str) -> int | None:
    """--default-max-tokens: a positive number, or 'context' (None: the rest of the context window)."""
    if text.strip().lower() == "context":
        return None
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a positive number of tokens or 'context', got {text!r}") from None


def gamma_value(text: str) -> int | str:
    if text == "auto":
        return text
    return positive_int(text)


def gamma_list(text: str) -> list[int | str]:
    """``--gammas 2,4,auto`` → [2, 4, "auto"], or a one-line error naming the flag (bench and tune)."""
    try:
        return [gamma_value(g.strip()) for g in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise SpecdecError(f"--gammas {text}: {exc}") from None


def string_list(text: str) -> list[str]:
    """``--allowed-origins '["https://a.example", "http://localhost:3000"]'`` (vLLM's JSON form) or a comma-separated
    list; ``[]`` or an empty string is no entry."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            values = json.loads(stripped)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a JSON list of strings: {text!r}") from None
        if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
            raise argparse.ArgumentTypeError(f"not a JSON list of strings: {text!r}")
        return [value.strip() for value in values if value.strip()]
    return [value.strip() for value in stripped.split(",") if value.strip()]
