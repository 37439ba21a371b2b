"""What a request's committed tokens become: its output ids, its text, and when it finishes.

Speculation commits several tokens per step; the tracker takes them one at a time, exactly as plain
decoding would, so a stop token, a stop string or ``max_tokens`` inside an accepted block ends the
output at the same token, and the streamed text never shows a stop string's first characters.
"""

from __future__ import annotations

from specdec.sampling import SamplingParams


def request_stop_ids(params: SamplingParams, tokenizer) -> frozenset[int]:  # noqa: ANN001 - Tokenizer | None
    """The tokens that end a request: its ``stop_token_ids``, and the tokenizer's end-of-sequence
    ids unless ``ignore_eos`` (the same set the output tracker stops at and ``min_tokens`` bans)."""
    stop_ids = frozenset(params.stop_token_ids)
    if tokenizer is not None and not params.ignore_eos:
        stop_ids |= tokenizer.stop_token_ids
    return stop_ids


class OutputTracker:
    """Applies max_tokens, stop token ids and stop strings to committed tokens, one token at a time,
    exactly as plain decoding would — so tokens past a stop inside an accepted block never leak."""

    def __init__(self, params: SamplingParams, stop_ids: frozenset[int], tokenizer) -> None:  # noqa: ANN001
        self.params = params
        self.stop_ids = stop_ids
        #: vLLM's ``stop_token_ids`` stay in the output ("unless the stop tokens are special tokens": then in the ids
        #: only, as the text skips special tokens); the model's own end of sequence does not (it was dropped too)
        self.kept_stop_ids = frozenset(params.stop_token_ids) - (tokenizer.stop_token_ids if tokenizer is not None else frozenset())
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.detok = None
        self.text = ""
        self.emitted = 0  # characters of self.text already streamed
        self.holdback = max((len(s) for s in params.stop), default=1) - 1
        self.stopped_by_string = False
        #: tokens the last :meth:`add` read: those it committed and the stop token that ended the request
        #: (the rest of a verified block, after it, never counts: not as output, not in the stats)
        self.consumed = 0
        if tokenizer is not None:
            from specdec.tokenizer import IncrementalDetokenizer

            self.detok = IncrementalDetokenizer(tokenizer, params.skip_special_tokens)

    def add(self, tokens: list[int]) -> list[int]:
        """Commit tokens in order until one finishes the request; return the ones that count."""
        taken: list[int] = []
        self.consumed = 0
        for token in tokens:
            self.consumed += 1
            if token in self.stop_ids:
                self.finish_reason = "stop"
                if token in self.kept_stop_ids:
                    self.token_ids.append(token)
                    taken.append(token)
                    if self.detok is not None:
                        self.text += self.detok.push(token)
                break
            self.token_ids.append(token)
            taken.append(token)
            if self.detok is not None:
                before = len(self.text)
                self.text += self.detok.push(token)
                if self.params.stop and len(self.token_ids) >= self.params.min_tokens and self._cut_at_stop_string(before):
                    self.finish_reason = "stop"
                    self.stopped_by_string = True
                    break
            if len(self.token_ids) >= self.params.max_tokens:
                self.finish_reason = "length"
                break
        return taken

    def end_with_grammar(self, grammar_finished: bool) -> None:
        """A completed grammar ends the request even when its stop token does not (``ignore_eos``)."""
        if grammar_finished and self.finish_reason is None:
            self.finish_reason = "stop"

    def _cut_at_stop_string(self, before: int) -> bool:
        window_start = max(0, before - self.holdback)
        hits = [(i, len(s)) for s in self.params.stop if (i := self.text.find(s, window_start)) >= 0]
        if not hits:
            return False
        start, length = min(hits)
        self.text = self.text[: start + length if self.params.include_stop_str_in_output else start]
        return True

    def new_text(self) -> str:
        """Text that can no longer change: all of it once finished, else all but a possible
        stop-string prefix at the end."""
        if self.finish_reason is not None and not self.stopped_by_string and self.detok is not None:
            self.text += self.detok.flush()
            self.detok = None
        end = len(self.text) if self.finish_reason is not None else len(self.text) - self.holdback
        chunk = self.text[self.emitted : max(end, self.emitted)]
        self.emitted = max(end, self.emitted)
        return chunk
