"""The bodies of OpenAI responses that do not depend on a request's lifecycle: usage with the
speculative stats, the logprobs object (chat and completions shapes) and server-sent events."""

from __future__ import annotations

import codecs
import json
from typing import Any

from specdec.sampling import TokenLogprob


def sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


def token_text(token_bytes: bytes) -> str:
    """A logprobs entry's ``token``: its text, or — part of a character split across tokens — its bytes
    spelt ``bytes:\\xf0\\x9d`` (vLLM's form), so distinct partial tokens never collide as U+FFFD."""
    try:
        return token_bytes.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in token_bytes)


class TextOffsets:
    """Completions' ``text_offset`` for tokens given one after another (one response, or a stream's
    chunks): a token's offset is the characters its predecessors' bytes complete, so it never runs
    backwards where a character's bytes are split across tokens, or across chunks (each token decoded
    alone counted one U+FFFD per piece)."""

    def __init__(self, start: int = 0) -> None:
        self.position = start
        self._characters = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def advance(self, piece: bytes) -> int:
        """``piece``'s offset; the position moves past the characters it completes."""
        offset = self.position
        self.position += len(self._characters.decode(piece))
        return offset


def logprobs_body(scores: list[TokenLogprob], tokenizer: Any, chat: bool, offsets: TextOffsets | None = None) -> dict[str, Any]:
    """OpenAI's logprobs object: chat ``{"content": [{token, logprob, bytes, top_logprobs}]}``,
    completions ``{tokens, token_logprobs, top_logprobs, text_offset}`` (offsets continuing ``offsets``)."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        raw = tokenizer.token_bytes(token_id)
        return {"token": token_text(raw), "logprob": logprob, "bytes": list(raw)}

    if chat:
        return {"content": [{**entry(s.token_id, s.logprob), "top_logprobs": [entry(t, lp) for t, lp in s.top]}
                            for s in scores]}
    return completion_logprobs([s.token_id for s in scores], scores, tokenizer, offsets or TextOffsets())


def completion_logprobs(token_ids: list[int], scores: list[TokenLogprob | None], tokenizer: Any,
                        offsets: TextOffsets, top: int | None = None) -> dict[str, Any]:
    """Completions' ``{tokens, token_logprobs, top_logprobs, text_offset}`` (``top``: alternatives shown, when
    the scores carry more); a token without a score (an echoed prompt's first) gets nulls. Each ``top_logprobs``
    entry holds the token itself too, where it is not among the likeliest (OpenAI's legacy completions: "up to
    logprobs+1 elements"; vLLM's the same): a client looking the chosen token up there found no key."""
    raw = [tokenizer.token_bytes(token) for token in token_ids]

    def alternatives(piece: bytes, score: TokenLogprob) -> dict[str, float]:
        shown = {token_text(tokenizer.token_bytes(t)): lp for t, lp in score.top[:top]}
        shown.setdefault(token_text(piece), score.logprob)
        return shown

    return {"tokens": [token_text(piece) for piece in raw], "token_logprobs": [None if s is None else s.logprob for s in scores],
            "top_logprobs": [None if s is None else alternatives(piece, s) for piece, s in zip(raw, scores, strict=True)],
            "text_offset": [offsets.advance(piece) for piece in raw]}


def vllm_prompt_logprobs(scores: list[TokenLogprob | None], top: int, tokenizer: Any) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token null (the first: nothing precedes it) or ``{token id:
    {logprob, rank, decoded_token}}`` for the prompt's token and the ``top`` likeliest."""
    def entry(token_id: int, logprob: float, rank: int) -> dict[str, Any]:
        return {"logprob": logprob, "rank": rank, "decoded_token": token_text(tokenizer.token_bytes(token_id))}

    rows: list[dict[str, Any] | None] = []
    for score in scores:
        if score is None:
            rows.append(None)
            continue
        row = {str(score.token_id): entry(score.token_id, score.logprob, score.rank)}
        for rank, (token, logprob) in enumerate(score.top[:top], start=1):
            row.setdefault(str(token), entry(token, logprob, rank))
        rows.append(row)
    return rows


def joined_logprobs(first: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """Two completions logprobs objects, one after the other (an echoed prompt's, then the output's)."""
    return {key: first[key] + then[key] for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def usage_body(stats) -> dict[str, Any]:  # noqa: ANN001
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens},
        "speculative": {"method": stats.method, "draft_tokens": stats.proposed_tokens, "accepted_tokens": stats.accepted_tokens,
                        "acceptance_rate": round(stats.acceptance_rate, 4), "mean_accepted_len": round(stats.mean_accepted_len, 4),
                        "tokens_per_s": round(stats.tokens_per_s, 3), "ttft_s": round(stats.ttft_s, 4)},
    }
