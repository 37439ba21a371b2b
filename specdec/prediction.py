"""Predicted outputs (OpenAI's ``prediction``): the client already knows most of the answer — the
file it asked to edit, the previous version of a reply — and says so. That is a free draft:
speculative decoding verifies it like any other proposal, so the output stays exactly the target's
and only the time changes (long runs of the prediction are accepted in one target pass each).

The suffix drafters (:mod:`specdec.drafters.suffix`, and ``draft_suffix`` through it) keep the
prediction as a third frequency table beside the request's own tokens and the shared cache: after
an edit point the output drifts away from it, and a few tokens later, when the output's last tokens
occur in the prediction again, drafting from it resumes. Prompt lookup (``ngram``) reads it through
:class:`PredictionIndex`. This module turns the request's field into token ids, indexes it for
n-gram lookup and counts what the target kept of it.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Sequence

from specdec.errors import SpecdecError

if TYPE_CHECKING:
    from specdec.tokenizer import Tokenizer


def prediction_ids(prediction: str | list[int] | None, tokenizer: "Tokenizer | None", vocab_size: int,
                   context_len: int) -> tuple[int, ...]:
    """``SamplingParams.prediction`` as token ids (text through the target's tokenizer, no special
    tokens), checked against the vocabulary and the context; ``()`` without one.

    A prediction longer than the model's context could never be followed to its end: refused, as a
    prompt that long is."""
    if prediction is None:
        return ()
    if isinstance(prediction, str):
        if tokenizer is None:
            raise SpecdecError("prediction is text but this model has no tokenizer: pass token ids")
        ids = tokenizer.encode(prediction, add_special_tokens=False)
    else:
        ids = list(prediction)
    outside = sorted({token for token in ids if token >= vocab_size})
    if outside:
        raise SpecdecError(f"prediction holds token ids outside the vocabulary (0..{vocab_size - 1}): {outside[:5]}")
    if len(ids) > context_len:
        raise SpecdecError(f"prediction is {len(ids)} tokens, longer than the model's context of {context_len}")
    return tuple(ids)


def count_prediction(tokens: Sequence[int], predicted: Sequence[bool], num_accepted: int,
                     next_token: int) -> tuple[int, int]:
    """``(accepted, rejected)`` tokens of the prediction in one chain round: ``tokens [k]`` proposed,
    ``predicted [k]`` which came from the prediction, the first ``num_accepted`` kept and then
    ``next_token`` committed. The token at ``num_accepted`` was checked (kept when it equals
    ``next_token``); later ones were never compared, so they count as neither."""
    accepted = sum(1 for is_predicted in predicted[:num_accepted] if is_predicted)
    rejected = 0
    if num_accepted < len(tokens) and predicted[num_accepted]:
        if tokens[num_accepted] == next_token:
            accepted += 1
        else:
            rejected += 1
    return accepted, rejected


class PredictionIndex:
    """The predicted output as n-gram lookup reads it (:mod:`specdec.drafters.prompt_lookup`): each
    n-gram of the prompt's last tokens + the prediction → the positions right after it, so the
    context's last n tokens find where in the prediction the output has got to. Of several places
    the first at or after the last one followed wins: a prediction is read in order (a code file
    repeats its lines, and the next ``return`` is the one after this one)."""

    def __init__(self, prompt_tail: list[int], prediction: Sequence[int], min_n: int, max_n: int) -> None:
        self.tokens = list(prompt_tail) + list(prediction)
        self.min_n, self.max_n = min_n, max_n
        self.positions: dict[tuple[int, ...], list[int]] = {}
        for position in range(len(prompt_tail), len(self.tokens)):  # ascending, so each list is sorted
            for n in range(min_n, min(max_n, position) + 1):
                self.positions.setdefault(tuple(self.tokens[position - n : position]), []).append(position)
        self.cursor = len(prompt_tail)  # the position after the last token followed

    def find(self, context: list[int]) -> tuple[int, int] | None:
        """``(position, n)``: where the prediction goes on after the context's last ``n`` tokens,
        the longest n that occurs; None if none does."""
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            places = self.positions.get(tuple(context[-n:]))
            if places:
                after = bisect.bisect_left(places, self.cursor)
                return (places[after] if after < len(places) else places[0]), n
        return None

    def follow(self, position: int, count: int) -> None:
        """The output followed the prediction for ``count`` tokens from ``position``."""
        self.cursor = position + count
