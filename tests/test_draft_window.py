"""The draft model reads only the last ``draft_context_window`` prompt tokens: cheaper first rounds
on long prompts, output unchanged (greedy identical, the draft cache in step with the window)."""

from __future__ import annotations

import pytest

import specdec
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams

PROMPT = "def add(a, b):\n    return a + b\n\n" * 6


class CountingBackend:
    """Wraps a backend and records how many tokens each forward fed."""

    def __init__(self, inner):  # noqa: ANN001
        self.inner, self.fed = inner, []

    def __getattr__(self, name):  # noqa: ANN001, ANN204
        return getattr(self.inner, name)

    def forward(self, state, tokens, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
        self.fed.append(len(tokens))
        return self.inner.forward(state, tokens, *args, **kwargs)


@pytest.mark.parametrize("method", ["draft_model", "draft_suffix"])
@pytest.mark.parametrize("window", [0, 8, 40])
def test_window_keeps_greedy_output_identical(tiny_target, tiny_dirs, method, window):
    draft = specdec.load_model(tiny_dirs["draft"], dtype="float32", device="cpu")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain = specdec.generate(tiny_target, PROMPT, params)
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=3, draft_context_window=window)
    out = specdec.generate(tiny_target, PROMPT, params, draft=draft, spec=spec)
    assert out.token_ids == plain.token_ids
    assert out.stats.proposed_tokens > 0


def test_first_round_feeds_only_the_window(tiny_target, tiny_dirs):
    from specdec.api import encode_prompt, make_drafter
    from specdec.sampling import make_generator

    draft = specdec.load_model(tiny_dirs["draft"], dtype="float32", device="cpu")
    counting = CountingBackend(draft.backend)
    draft.backend = counting
    ids = encode_prompt(tiny_target, PROMPT)
    assert len(ids) > 20
    params = SamplingParams(temperature=0.0, max_tokens=8)
    drafter = make_drafter(tiny_target, specdec.SpecConfig(method="draft_model", draft_context_window=12, spec_tree="off"), params,
                           make_generator(0), len(ids) + 16, draft)
    drafter.start(ids)
    first = drafter.propose(ids + [5], 3)
    assert counting.fed[0] == 12  # the prompt pass: the window, not the whole prompt
    assert drafter.state.seq_len == len(drafter.cached) == 12 + len(first.tokens) - 1
    drafter.accepted(1, 7)
    drafter.propose(ids + [5, first.tokens[0], 7], 3)
    # only what the cache lacks (the correction token, and the accepted draft token if it was never
    # fed): no re-read of the prompt
    assert counting.fed[len(first.tokens)] == (1 if len(first.tokens) > 1 else 2)


def test_negative_window_is_refused():
    with pytest.raises(SpecdecError, match="draft_context_window"):
        specdec.SpecConfig(method="draft_model", draft_context_window=-1)
