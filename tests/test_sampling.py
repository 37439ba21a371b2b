"""The shared sampling transform against a brute-force reference; parameter validation; seeded sampling."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.sampling import (
    SamplingParams,
    inverse_cdf,
    logits_to_probs,
    make_generator,
    sample_from_probs,
    sample_rows,
)
from specdec.stats_tests import chi_square_pvalue


pytestmark = pytest.mark.usefixtures("one_thread")


def reference_probs(logits: list[float], t: float, k: int, top_p: float, min_p: float) -> list[float]:
    """Pure-Python float64 reference of the documented rules, written without sorting tricks."""
    scaled = [x / t for x in logits]
    keep = set(range(len(logits)))
    if k > 0:  # every token whose logit is >= the k-th largest logit
        kth = sorted(scaled, reverse=True)[k - 1]
        keep = {i for i in keep if scaled[i] >= kth}
    peak = max(scaled[i] for i in keep)
    weights = {i: math.exp(scaled[i] - peak) for i in keep}
    total = sum(weights.values())
    probs = {i: w / total for i, w in weights.items()}
    if top_p < 1:  # smallest set of most likely tokens whose mass reaches top_p, plus ties of its last one
        nucleus, mass = [], 0.0
        for i in sorted(probs, key=lambda i: -probs[i]):
            if mass >= top_p:
                break
            nucleus.append(i)
            mass += probs[i]
        boundary = min(probs[i] for i in nucleus)
        probs = {i: v for i, v in probs.items() if v >= boundary}
    if min_p > 0:
        top = max(probs.values())
        probs = {i: v for i, v in probs.items() if v >= min_p * top}
    total = sum(probs.values())
    return [probs.get(i, 0.0) / total for i in range(len(logits))]


CONFIGS = [
    (1.0, 0, 1.0, 0.0),  # plain softmax
    (0.5, 0, 1.0, 0.0),  # temperature only
    (2.0, 0, 1.0, 0.0),
    (0.7, 3, 1.0, 0.0),  # top-k
    (1.0, -1, 1.0, 0.0),  # -1 = off
    (1.0, 0, 0.8, 0.0),  # top-p
    (1.0, 0, 0.3, 0.0),
    (1.0, 0, 1.0, 0.2),  # min-p
    (1.3, 5, 0.9, 0.0),  # combinations
    (0.8, 0, 0.9, 0.05),
    (0.5, 4, 0.7, 0.1),
    (1.0, 12, 0.95, 0.3),  # top-k == V is a no-op
]


@pytest.mark.parametrize("t,k,top_p,min_p", CONFIGS)
def test_transform_matches_reference_row_by_row(t, k, top_p, min_p):
    logits = torch.randn(8, 12, generator=torch.Generator().manual_seed(0)) * 2
    params = SamplingParams(temperature=t, top_k=k, top_p=top_p, min_p=min_p)
    got = logits_to_probs(logits, params)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    for row in range(logits.shape[0]):
        expected = torch.tensor(reference_probs(logits[row].tolist(), t, k, top_p, min_p), dtype=torch.float32)
        torch.testing.assert_close(got[row], expected, atol=1e-6, rtol=1e-5)
        assert ((got[row] > 0) == (expected > 0)).all()  # exactly the same kept set
        if 0 < k < 12:  # continuous random logits: no ties, so exactly k survive top-k
            assert int((got[row] > 0).sum()) <= k
            if top_p == 1.0 and min_p == 0.0:
                assert int((got[row] > 0).sum()) == k


def test_rows_are_independent_of_each_other_and_of_batch_shape():
    logits = torch.randn(5, 10, generator=torch.Generator().manual_seed(1)) * 3
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.85, min_p=0.05)
    whole = logits_to_probs(logits, params)
    perm = torch.tensor([3, 0, 4, 1, 2])
    torch.testing.assert_close(logits_to_probs(logits[perm], params), whole[perm], atol=0, rtol=0)
    for row in range(5):
        torch.testing.assert_close(logits_to_probs(logits[row], params), whole[row], atol=0, rtol=0)
    batched = logits_to_probs(logits.reshape(5, 1, 10), params)  # [..., V] with extra leading dims
    torch.testing.assert_close(batched.reshape(5, 10), whole, atol=0, rtol=0)


def test_temperature_scales_log_probabilities():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    for t in (0.25, 1.0, 3.0):
        probs = logits_to_probs(logits, SamplingParams(temperature=t))
        log_ratio = torch.log(probs[0] / probs[1:])
        torch.testing.assert_close(log_ratio, (logits[0] - logits[1:]) / t, atol=1e-4, rtol=1e-4)


def test_tiny_temperature_and_masked_logits_stay_finite():
    logits = torch.tensor([[100.0, 99.0, float("-inf"), -50.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=1e-6))
    assert torch.isfinite(probs).all() and probs[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0))
    assert probs[0, 2] == 0 and abs(float(probs.sum()) - 1) < 1e-6


def test_low_precision_logits_give_float32_probs():
    logits = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    for dtype in (torch.bfloat16, torch.float16):
        probs = logits_to_probs(logits.to(dtype), SamplingParams(temperature=0.8, top_p=0.9))
        assert probs.dtype == torch.float32
        torch.testing.assert_close(probs.sum(-1), torch.ones(3))


def test_top_k_ties_at_the_boundary_are_all_kept():
    probs = logits_to_probs(torch.tensor([3.0, 2.0, 2.0, 1.0, 0.0]), SamplingParams(top_k=2))
    assert (probs > 0).tolist() == [True, True, True, False, False]  # 2nd and 3rd tie: both stay
    probs = logits_to_probs(torch.tensor([3.0, 2.0, 1.0, 1.0]), SamplingParams(top_k=2))
    assert (probs > 0).tolist() == [True, True, False, False]  # tie below the boundary: both go


@pytest.mark.parametrize("top_p,kept", [
    (0.49, [True, False, False, False]),  # the top token alone reaches 0.49
    (0.6, [True, True, False, False]),  # 0.5 < 0.6: the boundary token 0.3 joins (mass 0.8 ≥ 0.6)
    (0.79, [True, True, False, False]),
    (0.81, [True, True, True, False]),
    (0.96, [True, True, True, True]),
])
def test_top_p_keeps_the_smallest_set_including_the_boundary_token(top_p, kept):
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = logits_to_probs(logits, SamplingParams(top_p=top_p))
    assert (probs > 0).tolist() == kept
    expected = torch.tensor([0.5, 0.3, 0.15, 0.05]) * torch.tensor(kept)
    torch.testing.assert_close(probs, expected / expected.sum())


def test_top_p_mass_exactly_equal_to_top_p_stops_the_nucleus():
    """'Reaches' means ≥: when the top tokens' mass equals top_p exactly, the next token is out."""
    logits = torch.tensor([1.0, 0.0, -0.5, -1.0])
    top_p = float(torch.softmax(logits - logits.max(), -1)[0])  # exactly the top token's float32 mass
    assert (logits_to_probs(logits, SamplingParams(top_p=top_p)) > 0).tolist() == [True, False, False, False]
    assert (logits_to_probs(logits, SamplingParams(top_p=top_p * (1 + 1e-6))) > 0).tolist() == [True, True, False, False]


def test_top_p_ties_with_the_boundary_token_are_all_kept():
    logits = torch.log(torch.tensor([0.4, 0.2, 0.2, 0.2]))
    probs = logits_to_probs(logits, SamplingParams(top_p=0.5))  # 0.4 + one 0.2 reaches 0.5; its ties stay
    assert (probs > 0).all()
    logits = torch.log(torch.tensor([0.2, 0.2, 0.4, 0.2]))  # same values, other positions: same rule
    assert (logits_to_probs(logits, SamplingParams(top_p=0.5)) > 0).all()


@pytest.mark.parametrize("scale,nucleus_range", [
    (6.0, (1, 256)),  # peaked: the boundary lies in the first topk window
    (1.5, (256, 4096)),  # the second window
    (0.05, (4096, 8192)),  # nearly flat: falls back to the full sort
])
def test_top_p_topk_windows_equal_the_full_sort(monkeypatch, scale, nucleus_range):
    import specdec.sampling as sampling

    logits = torch.randn(3, 8192, generator=torch.Generator().manual_seed(7)) * scale
    logits[1, :40] = logits[1, 40]  # a tie group, so the value-based tie rule is exercised at scale too
    params = SamplingParams(temperature=0.9, top_p=0.9)
    windowed = logits_to_probs(logits, params)
    monkeypatch.setattr(sampling, "_TOP_P_WINDOWS", ())
    full_sort = logits_to_probs(logits, params)
    assert torch.equal(windowed, full_sort)
    kept = (windowed > 0).sum(-1)
    assert ((kept >= nucleus_range[0]) & (kept < nucleus_range[1])).all(), kept  # the regime is the one named
    for row in (0, 2):  # and the brute-force reference agrees (float64 vs float32 rounding aside)
        expected = torch.tensor(reference_probs(logits[row].tolist(), 0.9, 0, 0.9, 0.0), dtype=torch.float32)
        assert ((windowed[row] > 0) == (expected > 0)).all()


def test_min_p_is_relative_to_the_most_likely_token():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert (logits_to_probs(logits, SamplingParams(min_p=0.35)) > 0).tolist() == [True, True, False, False]
    # threshold 0.2 * 0.5 = 0.1 keeps 0.15 (an absolute 0.2 would drop it)
    assert (logits_to_probs(logits, SamplingParams(min_p=0.2)) > 0).tolist() == [True, True, True, False]


def test_greedy_is_one_hot_argmax_with_lowest_id_on_ties_and_ignores_filters():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0], [0.0, 0.0, 0.0, 7.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=0, top_k=1, top_p=0.1, min_p=0.5))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
    assert SamplingParams(temperature=0).is_greedy and not SamplingParams(temperature=1e-6).is_greedy


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=-1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature="1"), "temperature"),
    (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"),
    (dict(min_p=1.0), "min_p"), (dict(min_p=-0.1), "min_p"),
    (dict(top_k=-2), "top_k"), (dict(top_k=2.5), "top_k"),
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=1.5), "max_tokens"),
    (dict(seed=-1), "seed"), (dict(seed="7"), "seed"),
    (dict(stop=[""]), "stop"), (dict(stop_token_ids=[-3]), "stop_token_ids"),
])
def test_invalid_params_are_clear_errors(kwargs, message):
    with pytest.raises(SpecdecError, match=message):
        SamplingParams(**kwargs)


def test_valid_edge_params_are_accepted():
    SamplingParams(temperature=0, top_k=-1, top_p=1.0, min_p=0.0, seed=0, max_tokens=1)
    SamplingParams(top_k=1, top_p=1e-9, min_p=0.999, seed=2**63 - 1)
    assert SamplingParams(stop="###").stop == ["###"]


def test_seeded_sampling_is_reproducible():
    probs = torch.softmax(torch.randn(8, generator=torch.Generator().manual_seed(3)), -1)
    gen1, gen2, gen3 = make_generator(11), make_generator(11), make_generator(12)
    seq1 = [sample_from_probs(probs, gen1) for _ in range(100)]
    assert seq1 == [sample_from_probs(probs, gen2) for _ in range(100)]
    assert seq1 != [sample_from_probs(probs, gen3) for _ in range(100)]
    assert sample_rows(probs.expand(50, 8), make_generator(5)).tolist() == sample_rows(probs.expand(50, 8), make_generator(5)).tolist()
    unseeded = [make_generator(None) for _ in range(2)]
    assert [sample_from_probs(probs, unseeded[0]) for _ in range(64)] != [sample_from_probs(probs, unseeded[1]) for _ in range(64)]


def test_sampling_never_picks_zero_mass_tokens():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0, 0.0])
    tokens = sample_rows(probs.expand(4000, 6), make_generator(0))
    assert set(tokens.tolist()) == {1, 3}
    # the extreme uniforms, including the rounding case u * total == total, stay on tokens with mass
    assert inverse_cdf(probs, torch.tensor(0.0)).item() == 1
    assert inverse_cdf(probs, torch.tensor(1.0)).item() == 3
    assert inverse_cdf(probs * 3, torch.tensor(0.5)).item() == 3  # unnormalised weights are fine
    assert inverse_cdf(probs, torch.tensor(0.4999)).item() == 1


def test_sampled_frequencies_match_probs():
    probs = torch.softmax(torch.randn(10, generator=torch.Generator().manual_seed(4)) * 2, -1)
    tokens = sample_rows(probs.expand(40_000, 10), make_generator(6))
    counts = torch.bincount(tokens, minlength=10).tolist()
    assert chi_square_pvalue(counts, probs.tolist()) > 1e-3
    shifted = torch.roll(probs, 1)  # power: the same counts against a different distribution
    assert chi_square_pvalue(counts, shifted.tolist()) < 1e-6


@pytest.mark.parametrize("vocab", [151936, 151936 + 37, 4 * 128, 100])
def test_greedy_ids_is_torch_argmax_ties_tails_and_nans_included(vocab):
    """The blocked CPU argmax returns torch.argmax's index for every row: the first of tied maxima
    (also across blocks and in a shorter last block), -inf rows, a NaN (argmax's winner), bfloat16,
    1-D and 3-D inputs."""
    from specdec.sampling import greedy_ids

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(9, vocab, generator=gen)
    logits[1, 3] = logits[1, vocab - 1] = 50.0  # tie across blocks: the first wins
    logits[2, vocab - 1] = 60.0  # the maximum in the last (shorter) block
    logits[3, min(130, vocab - 1)] = logits[3, min(129, vocab - 2)] = 70.0  # tie inside one block
    logits[4] = float("-inf")
    logits[5, vocab // 2] = float("nan")
    logits[6] = 0.0  # all tied
    for case in (logits, logits.bfloat16(), logits[0], logits.reshape(3, 3, vocab)):
        assert torch.equal(greedy_ids(case), case.argmax(-1)), case.shape


@pytest.mark.parametrize("vocab", [151936, 32768, 151936 + 37, 300])
def test_top_candidates_are_torch_topk_values_with_their_ids(vocab):
    """The blocked top-k: the same values as torch.topk, descending, each id pointing at its value,
    no id twice — with the maxima crowded into one block, spread over blocks, or tied."""
    from specdec.sampling import top_candidates

    gen = torch.Generator().manual_seed(1)
    scores = torch.softmax(torch.randn(4, vocab, generator=gen) * 3, -1)
    scores[1, 10:13] = 0.5  # the three largest in one block, tied
    scores[2, [5, vocab // 2, vocab - 1]] = torch.tensor([0.7, 0.6, 0.65])  # in three blocks
    for case in (scores, scores[0]):
        values, ids = top_candidates(case, 3)
        assert torch.equal(values, torch.topk(case, 3, dim=-1).values)
        assert torch.equal(case.gather(-1, ids), values)
        assert all(len(set(row)) == 3 for row in ids.reshape(-1, 3).tolist())


def test_blocked_inverse_cdf_draws_what_the_whole_row_cumsum_draws():
    """The CPU's blocked inverse CDF against the float64 cumsum over the whole row: the same token
    for 3 000 uniforms (edges 0 and 1⁻ included) on a peaked, a flat and an unnormalised row with
    zero-weight runs across block boundaries — and never a zero-weight token."""
    from specdec.sampling import _blocked_inverse_cdf

    gen = torch.Generator().manual_seed(2)
    vocab = 151936
    peaked = torch.softmax(torch.randn(vocab, generator=gen) * 4, -1)
    flat = torch.full((vocab,), 1.0 / vocab)
    holes = torch.rand(vocab, generator=gen) * 3.0
    holes[100:300] = 0.0  # across a block boundary
    holes[-129:] = 0.0  # the whole last block and one more
    holes[:5] = 0.0
    rows = torch.stack([peaked, flat, holes])
    uniforms = torch.rand(3000, 3, generator=gen, dtype=torch.float64)
    uniforms[0], uniforms[1] = 0.0, 1.0 - 2.0**-53
    expected_rows = []
    for row, column in zip(rows, uniforms.T):
        cdf = row.double().cumsum(-1)
        u = torch.minimum(column * cdf[-1], torch.nextafter(cdf[-1], torch.zeros(())))
        expected_rows.append(torch.searchsorted(cdf, u, right=True))
    drawn = torch.stack([torch.stack([_blocked_inverse_cdf(row, u) for u in column])
                         for row, column in zip(rows, uniforms.T)], dim=1)  # [3000, 3]
    assert torch.equal(drawn, torch.stack(expected_rows, dim=1))
    assert torch.equal(_blocked_inverse_cdf(rows, uniforms[7]), drawn[7])  # rows together: the same
    assert bool((rows.T.gather(0, drawn) > 0).all())
    assert _blocked_inverse_cdf(holes, torch.tensor(1.0 - 2.0**-53, dtype=torch.float64)).item() == vocab - 130
