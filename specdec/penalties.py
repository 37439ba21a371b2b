"""Logit bias, repetition / frequency / presence penalties and min_tokens, exact under speculation.

These are the sampling parameters of OpenAI's API (``logit_bias``, ``presence_penalty``,
``frequency_penalty``), vLLM's and HF's (``repetition_penalty``). Unlike temperature or top-p they
depend on the tokens *before* each position, which is why they are not part of
:func:`specdec.sampling.logits_to_probs`: a verification forward scores k + 1 rows at once, row i
after the committed tokens and the first i drafted ones, and row i must get the penalties of exactly
that history — what plain decoding applies at that position. Then greedy output is token-identical
to plain decoding and sampled output has the target's penalised distribution (the rejection test
sees p after the penalties; a model drafter applies the same ones to its q, which only raises α).

The definitions are vLLM's, in its order: the bias is added, then the repetition penalty divides a
positive logit (multiplies a negative one) of every token seen in the prompt or the output, then
``frequency_penalty × count`` and ``presence_penalty × [count > 0]`` are subtracted, the counts
over the output only. vLLM's ``min_tokens`` bans the stop tokens (end of sequence unless
``ignore_eos``, and ``stop_token_ids``) from rows before the output holds that many tokens — except a row
where nothing else is allowed (structured output whose grammar is complete): the grammar ends it there.
Temperature, top-k / top-p / min-p come after (``logits_to_probs``), greedy takes the argmax of the
penalised row.

Each row is transformed alone, by elementwise operations over the ids its history touched, so a
row gets the same bits whether it is scored alone or inside a chunk.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch

from specdec.errors import SpecdecError
from specdec.tree import path_to


def check_token_ids(field: str, ids: Iterable[int] | None, vocab_size: int) -> None:
    """Raise :class:`SpecdecError`, naming ``field`` first, when ``ids`` hold an id the model does not
    have (``logit_bias``'s keys, ``stop_token_ids``: one that can never be generated was accepted silently)."""
    outside = sorted(token for token in (ids or ()) if token >= vocab_size)
    if outside:
        raise SpecdecError(f"{field} names token ids outside the vocabulary (0..{vocab_size - 1}): {outside[:5]}")


class Penalties:
    """One request's logit bias and penalties: built from its sampling parameters and prompt, applied
    to any row given the output tokens before it. Stateless between calls (the history is passed
    in), so the engine and a drafter can share one.

    ``apply(logits [T, V] or [V], output_ids, drafted)``: row i follows ``output_ids`` (tokens
    generated after the prompt, all committed) and then ``drafted[:i]``."""

    def __init__(self, params, prompt_ids: Sequence[int], vocab_size: int, stop_ids: Iterable[int] = (),  # noqa: ANN001 - SamplingParams
                 strict: bool = True) -> None:
        self.presence, self.frequency = float(params.presence_penalty), float(params.frequency_penalty)
        self.repetition = float(params.repetition_penalty)
        self.min_tokens = params.min_tokens
        self.stop_ids = torch.tensor(sorted(t for t in stop_ids if t < vocab_size), dtype=torch.long)  # [S]
        self.prompt_len = len(prompt_ids)
        bias = dict(sorted((params.logit_bias or {}).items()))
        if strict:
            check_token_ids("logit_bias", bias, vocab_size)
        else:  # a draft with fewer ids than the target: it cannot draft those anyway
            bias = {token: value for token, value in bias.items() if token < vocab_size}
        self.bias_ids = torch.tensor(list(bias), dtype=torch.long)  # [B]
        self.bias_values = torch.tensor(list(bias.values()), dtype=torch.float32)  # [B]
        # the prompt's distinct ids: only the repetition penalty reads them
        self.prompt_ids = (torch.tensor(sorted(set(prompt_ids)), dtype=torch.long) if self.repetition != 1.0
                           else torch.zeros(0, dtype=torch.long))  # [P]

    @classmethod
    def build(cls, params, prompt_ids: Sequence[int], vocab_size: int, stop_ids: Iterable[int] = (),  # noqa: ANN001 - SamplingParams
              strict: bool = True) -> "Penalties | None":
        """The request's penalties, or None when its parameters set none (the common case costs nothing).
        ``stop_ids``: the tokens that end it (what ``min_tokens`` bans; a drafter that does not know
        them passes none: its q is then only less like p). ``strict``: a logit bias for an id outside
        the vocabulary is an error (the target's side); a drafter passes False (its rows may be
        fewer: those ids are skipped, and it cannot draft them)."""
        if not params.has_penalties:
            return None
        return cls(params, prompt_ids, vocab_size, stop_ids, strict)

    def output_of(self, context_ids: Sequence[int]) -> list[int]:
        """The generated part of a request's committed tokens (prompt + output)."""
        return list(context_ids[self.prompt_len :])

    def apply(self, logits: torch.Tensor, output_ids: Sequence[int], drafted: Sequence[int] = ()) -> torch.Tensor:
        """``logits [T, V]`` (or ``[V]``, then T = 1) → float32 penalised logits, row i after
        ``output_ids`` + ``drafted[:i]``. A new tensor; the input is left as it is."""
        single = logits.dim() == 1
        rows = logits.reshape(1, -1) if single else logits
        output = list(output_ids)
        out = self._apply_rows(rows, [output + [int(t) for t in drafted[:i]] for i in range(rows.shape[0])])
        return out[0] if single else out

    def apply_tree(self, logits: torch.Tensor, output_ids: Sequence[int], tokens: Sequence[int],
                   parents: Sequence[int]) -> torch.Tensor:
        """A token tree's verification rows ``logits [N + 1, V]`` (row 0 after the committed tokens,
        row i + 1 after node i: ``tokens [N]``, ``parents [N]``, -1 for the root's children) → row
        i + 1 penalised after the output and node i's path from the root, node i included."""
        output = list(output_ids)
        paths = [[int(tokens[i]) for i in path_to(parents, node)] for node in range(len(parents))]
        return self._apply_rows(logits, [output] + [output + path for path in paths])

    def _apply_rows(self, rows: torch.Tensor, histories: list[list[int]]) -> torch.Tensor:
        out = rows.float().clone()
        for row, history in zip(out, histories):
            self._apply_row(row, history)
        return out

    def for_context(self, context_ids: Sequence[int]) -> Callable[[torch.Tensor, Sequence[int]], torch.Tensor]:
        """``shape(logits [V], drafted)``: the row after ``context_ids`` and then ``drafted`` — what a
        model drafter applies to each step's logits."""
        output = self.output_of(context_ids)
        return lambda logits, drafted: self.apply(logits, [*output, *drafted])

    def _apply_row(self, row: torch.Tensor, history: list[int]) -> None:
        """Penalise one float32 row ``[V]`` in place after ``history`` (output tokens). A row may be narrower than
        the vocabulary the penalties were built for (a draft head scoring the first ``--draft-vocab-size`` ids): ids
        past its end are skipped — the 0.5B draft's 65536-id rows indexed EOS 151643 (``min_tokens``) and a high
        ``logit_bias`` id, an IndexError for the request."""
        device, vocab = row.device, row.shape[0]
        if len(history) < self.min_tokens and len(self.stop_ids):
            stop = self.stop_ids[self.stop_ids < vocab].to(device)
            kept = row[stop]
            row[stop] = float("-inf")
            if not bool(torch.isfinite(row).any()):  # only a stop token was allowed (a completed grammar): it ends the
                row[stop] = kept  # output — banned, argmax took token 0 and the grammar refused it (a server's 500)
        if len(self.bias_ids):
            inside = self.bias_ids < vocab
            ids = self.bias_ids[inside].to(device)
            row[ids] = row[ids] + self.bias_values[inside].to(device)
        seen = torch.tensor([token for token in history if token < vocab], dtype=torch.long, device=device)  # [H]
        if self.repetition != 1.0:
            ids = torch.unique(torch.cat([self.prompt_ids.to(device), seen]))  # sorted, distinct
            ids = ids[ids < vocab]
            values = row[ids]
            row[ids] = torch.where(values > 0, values / self.repetition, values * self.repetition)
        if (self.frequency or self.presence) and len(seen):
            ids, counts = torch.unique(seen, return_counts=True)
            row[ids] = row[ids] - (self.frequency * counts.float() + self.presence)


def penalty_shape(penalties: Penalties | None, context_ids: Sequence[int]) -> Callable[[torch.Tensor, Sequence[int]], torch.Tensor] | None:
    """A model drafter's ``shape`` for this round's draft steps (None: the request sets no penalties)."""
    return penalties.for_context(context_ids) if penalties is not None else None
