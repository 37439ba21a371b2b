"""Prompt lookup (n-gram) drafting: propose what followed the most recent earlier occurrence of
the last n tokens in prompt + output (Saxena 2023; vLLM ``method="ngram"``).

Zero model cost and zero extra memory beyond an index. The index maps every n-gram (n in
[min, max]) to the position right after its most recent occurrence *whose continuation is known*,
and is updated per committed token — proposing never rescans the context (O(max) per token, O(1)
per lookup). Proposals are deterministic: q is a point mass, verified exactly by the shared verifier.
"""

from __future__ import annotations

from specdec.drafters.base import Draft, Drafter, DrafterResources, MethodInfo


class PromptLookupDrafter(Drafter):
    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> position of the token that followed it

    def start(self, prompt_ids: list[int]) -> None:
        self.tokens = []
        self.index = {}
        self._extend(prompt_ids)

    def _extend(self, new_tokens: list[int]) -> None:
        for token in new_tokens:
            position = len(self.tokens)  # ``token`` now follows every n-gram ending just before it
            for n in range(self.min_n, self.max_n + 1):
                if position >= n:
                    self.index[tuple(self.tokens[position - n : position])] = position
            self.tokens.append(token)

    def propose(self, context_ids: list[int], k: int) -> Draft:
        if len(context_ids) > len(self.tokens):
            self._extend(context_ids[len(self.tokens) :])
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(self.tokens) < n:
                continue
            position = self.index.get(tuple(self.tokens[-n:]))
            if position is not None:
                return Draft(tokens=self.tokens[position : position + k])
        return Draft(tokens=[])

    def finish(self) -> None:
        self.tokens = []
        self.index = {}


def make_prompt_lookup_drafter(res: DrafterResources) -> PromptLookupDrafter:
    return PromptLookupDrafter(res.spec.prompt_lookup_min, res.spec.prompt_lookup_max)


METHODS = (MethodInfo("ngram", make_prompt_lookup_drafter, "prompt lookup: what followed the last n tokens earlier in the context",
                      aliases=("prompt_lookup",), options=("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")),)
