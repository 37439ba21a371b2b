"""The bodies of OpenAI responses that do not depend on a request's lifecycle: usage with the
speculative stats, the logprobs object (chat and completions shapes) and server-sent events."""

from __future__ import annotations

import json
from typing import Any

from specdec.sampling import TokenLogprob


def sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


def logprobs_body(scores: list[TokenLogprob], decode: Any, chat: bool, text_start: int = 0) -> dict[str, Any]:
    """OpenAI's logprobs object: chat ``{"content": [{token, logprob, bytes, top_logprobs}]}``,
    completions ``{tokens, token_logprobs, top_logprobs, text_offset}``."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    if chat:
        return {"content": [{**entry(s.token_id, s.logprob), "top_logprobs": [entry(t, lp) for t, lp in s.top]}
                            for s in scores]}
    return completion_logprobs([s.token_id for s in scores], scores, decode, text_start)


def completion_logprobs(token_ids: list[int], scores: list[TokenLogprob | None], decode: Any,
                        text_start: int) -> dict[str, Any]:
    """Completions' ``{tokens, token_logprobs, top_logprobs, text_offset}``, the text offsets from
    ``text_start``; a token without a score (an echoed prompt's first) gets nulls."""
    tokens = [decode([token]) for token in token_ids]
    offsets, position = [], text_start
    for text in tokens:
        offsets.append(position)
        position += len(text)
    return {"tokens": tokens, "token_logprobs": [None if s is None else s.logprob for s in scores],
            "top_logprobs": [None if s is None else {decode([t]): lp for t, lp in s.top} for s in scores],
            "text_offset": offsets}


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
