"""A head's frequency-ranked draft vocabulary (specdec.train.vocab, ``HeadConfig.draft_vocab``): the
ids it scores come from its training data, any ids at all — and the output is still exact."""

from __future__ import annotations

import json

import pytest
import torch

import specdec
from specdec.certify import DISTRIBUTION_CONFIGS, distribution_check, tiny_model
from specdec.config import SpecConfig
from specdec.errors import SpecdecError
from specdec.models.head_files import load_head, save_head
from specdec.models.heads import HeadConfig, new_head
from specdec.sampling import SamplingParams
from specdec.train.vocab import coverage, frequency_ids

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = ["def fibonacci(n):", "The quick brown fox jumps over the lazy dog. The quick"]


def test_frequency_ids_rank_the_targets_tokens_then_fill_with_the_first_ids():
    target_ids = torch.tensor([[9, 9, 9, 7, 7, 5, -1], [9, 7, 2, -1, -1, -1, -1]])
    assert frequency_ids(target_ids, 2, 10).tolist() == [7, 9]  # the two most frequent, ascending
    assert frequency_ids(target_ids, 6, 10).tolist() == [0, 1, 2, 5, 7, 9]  # all seen, then ids 0, 1
    assert frequency_ids(target_ids, 10, 10).tolist() == list(range(10))
    assert coverage(target_ids, torch.tensor([7, 9]), 2) == pytest.approx(7 / 9)
    assert coverage(target_ids, None, 6) == pytest.approx(2 / 9)  # the first 6 ids hold only 5 and 2


def scattered_ids(vocab_size: int, size: int, seed: int = 0) -> torch.Tensor:
    """``size`` ids spread over the whole vocabulary (half from its top), ascending."""
    generator = torch.Generator().manual_seed(seed)
    return torch.sort(torch.randperm(vocab_size, generator=generator)[:size]).values


def frequency_head(target_config, kind: str, size: int, scale: float = 0.2, seed: int = 0):
    torch.manual_seed(seed)
    config = HeadConfig.for_target(target_config, size, kind=kind, draft_vocab="frequency")
    head = new_head(config, scattered_ids(target_config.vocab_size, size, seed))
    with torch.no_grad():  # random, so drafts are sometimes rejected
        for param in head.parameters():
            param.add_(torch.randn_like(param) * scale)
    return head


@pytest.fixture(scope="module")
def frequency_dirs(tiny_target, tmp_path_factory):
    return {kind: save_head(frequency_head(tiny_target.config, kind, 300), tmp_path_factory.mktemp(kind))
            for kind in ("eagle", "medusa")}


def test_draft_ids_are_saved_as_integers_and_loaded_back(tiny_target, frequency_dirs):
    config = json.loads((frequency_dirs["eagle"] / "config.json").read_text())
    assert config["draft_vocab"] == "frequency"
    head = load_head(frequency_dirs["eagle"], tiny_target.config)
    assert head.draft_ids.dtype == torch.long
    assert torch.equal(head.draft_ids, scattered_ids(tiny_target.config.vocab_size, 300))
    with pytest.raises(SpecdecError, match="needs draft ids"):
        new_head(HeadConfig.for_target(tiny_target.config, 300, draft_vocab="frequency"))
    with pytest.raises(SpecdecError, match="unknown draft vocabulary"):
        HeadConfig.for_target(tiny_target.config, 300, draft_vocab="alphabetical")


@pytest.mark.parametrize("method", ["eagle", "medusa"])
@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_greedy_output_is_plain_decodings(tiny_dirs, frequency_dirs, method, quantize):
    target = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=quantize)
    for options in ({}, {"spec_tree": "auto"}):
        spec = SpecConfig(method=method, drafter_path=str(frequency_dirs[method]), num_speculative_tokens=4, **options)
        for prompt in PROMPTS:
            out = specdec.generate(target, prompt, GREEDY, spec=spec)
            assert out.token_ids == specdec.generate(target, prompt, GREEDY).token_ids, (prompt, options)
            assert out.stats.proposed_tokens > 0


def test_drafts_are_tokens_of_the_draft_vocabulary_with_q_zero_elsewhere(tiny_target, frequency_dirs):
    from tests.test_heads import sampled_eagle_draft

    ids_allowed = scattered_ids(tiny_target.config.vocab_size, 300)
    draft, drafter = sampled_eagle_draft(tiny_target, frequency_dirs["eagle"], PROMPTS[0])
    assert len(draft) == 4 and all(t in set(ids_allowed.tolist()) for t in draft.tokens)
    outside = torch.ones(tiny_target.config.vocab_size, dtype=torch.bool)
    outside[ids_allowed] = False
    assert float(draft.probs[:, outside].sum()) == 0.0 and float(draft.probs[:, ~outside].sum()) > 3.99
    assert drafter.scorer()(torch.randn(2, tiny_target.config.hidden_size)).shape == (2, 300)  # 300 rows scored


def test_int8_rows_of_any_ids_equal_the_full_heads(tiny_dirs):
    model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int8")
    decoder = model.backend.decoder
    ids = scattered_ids(model.config.vocab_size, 100)
    hidden = torch.randn(3, model.config.hidden_size)
    assert torch.equal(decoder.head_rows(ids)(hidden), decoder.lm_head(hidden)[:, ids])
    assert decoder.head_rows(ids.clone()) is decoder.head_rows(ids)  # built once per set of ids


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_sampling_distribution_is_the_targets(method, tmp_path):
    """χ² on the tiny 8-token model with a head that scores 5 scattered ids: q = 0 on the other 3."""
    head = frequency_head(tiny_model().config, method, 5, scale=0.3)
    assert head.draft_ids.tolist() != list(range(5))
    path = save_head(head, tmp_path / method)
    config = "T=1"
    result = distribution_check(method, config, DISTRIBUTION_CONFIGS[config], samples=2500,
                                spec_options={"drafter_path": str(path)})
    assert result.passed, result.detail


class OnlyToken:
    """A grammar that allows one token id (the ``mask_logits`` a GrammarConstraint offers)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def mask_logits(self, logits: torch.Tensor, drafted: list[int]) -> torch.Tensor:
        masked = torch.full_like(logits, float("-inf"))
        masked[self.token] = logits[self.token]
        return masked


def test_drafting_maps_the_rows_of_a_draft_vocabulary_to_their_token_ids():
    """Rows scored over ids [7, 2, 9] of 10: greedy maps the argmax row (no spread over the whole
    vocabulary), trees map their top rows, sampling and a grammar see the whole vocabulary."""
    from specdec.calls import run_now
    from specdec.drafters.model_steps import draft_steps, grow_tree
    from specdec.drafters.vocab import DraftVocab
    from specdec.sampling import make_generator

    vocab = DraftVocab(10, torch.tensor([7, 2, 9]))
    rows = torch.tensor([0.0, 3.0, 1.0])  # row 1 (token 2) first, then row 2 (token 9)

    def step(token: int):
        return rows
        yield  # noqa: unreachable - makes this a generator

    greedy = run_now(draft_steps(rows, step, 3, GREEDY, make_generator(0), vocab=vocab))
    assert greedy.tokens == [2, 2, 2] and greedy.probs is None
    constrained = run_now(draft_steps(rows, step, 2, GREEDY, make_generator(0), constraint=OnlyToken(9), vocab=vocab))
    assert constrained.tokens == [9, 9]
    sampled = run_now(draft_steps(rows, step, 3, SamplingParams(temperature=1.0), make_generator(0), vocab=vocab))
    assert sampled.probs.shape == (3, 10) and set(sampled.tokens) <= {7, 2, 9}
    assert torch.allclose(sampled.probs[0, [7, 2, 9]], torch.softmax(rows, -1)) and float(sampled.probs[0].sum()) == pytest.approx(1.0)

    def forward(expand, tokens, parents):
        return [torch.softmax(rows, -1) for _ in expand]
        yield  # noqa: unreachable

    tree = run_now(grow_tree(torch.softmax(rows, -1), 2, 1, forward, vocab))
    assert tree.tokens[:2] == [2, 9] and tree.parents[:2] == [-1, -1] and set(tree.tokens) <= {7, 2, 9}
