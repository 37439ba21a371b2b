"""The verifier: committed tokens are distributed exactly as the target's own samples.

Distribution tests are Pearson χ² goodness-of-fit tests at a stated significance: a case passes
when p-value > ALPHA = 1e-3. Seeds are fixed, so every run draws the same numbers (deterministic).
Trials run through ``rejection_sample_batch`` — the code the single-sequence ``rejection_sample``
(and so the engine) calls with B = 1 — so tens of thousands of trials take milliseconds. The power
tests at the end run broken samplers through the same harness and require them to be rejected.
"""

from __future__ import annotations

import math

import pytest
import torch

import specdec.verify as verify_module
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, logits_to_probs, make_generator, sample_rows
from specdec.stats_tests import chi_square_pvalue
from specdec.verify import greedy_verify, rejection_sample, rejection_sample_batch, verify

ALPHA = 1e-3
V = 8
TRIALS = 40_000


pytestmark = pytest.mark.usefixtures("one_thread")


def random_dist(seed: int, *shape: int, sparsity: float = 0.0, vocab: int = V) -> torch.Tensor:
    """Random rows over ``vocab``; ``sparsity`` zeroes that fraction of entries (supports differ)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(*shape, vocab, generator=gen) ** 2
    if sparsity:
        x = x * (torch.rand(*shape, vocab, generator=gen) >= sparsity)
        x[..., seed % vocab] += 0.05  # never an all-zero row
    return x / x.sum(-1, keepdim=True)


def bincount(tokens: torch.Tensor, cells: int = V) -> list[int]:
    return torch.bincount(tokens, minlength=cells).tolist()


# ----------------------------------------------------------------------------------------------
# Harness 1: fixed rows (p_0..p_k, q_0..q_{k-1}), the first emitted token must be ~ p_0.


def first_emitted(sampler, q: torch.Tensor | None, p: torch.Tensor, seed: int, trials: int = TRIALS,
                  point_tokens: list[int] | None = None) -> torch.Tensor:
    """First committed token of each trial: d_1 if accepted, else the correction."""
    k = p.shape[0] - 1
    gen = make_generator(seed)
    if q is None:
        tokens = torch.tensor(point_tokens).expand(trials, k)
    else:
        tokens = sample_rows(q.expand(trials, k, V), gen)  # d_i ~ q_i
    n_acc, nxt = sampler(tokens, None if q is None else q.expand(trials, k, V), p.expand(trials, k + 1, V), gen)
    return torch.where(n_acc > 0, tokens[:, 0], nxt)


@pytest.mark.parametrize("seed,k,sparsity", [(0, 1, 0.0), (1, 2, 0.0), (2, 3, 0.0), (3, 2, 0.4), (4, 4, 0.5)])
def test_first_token_has_target_distribution_dense_q(seed, k, sparsity):
    """Random p, q (sparse cases: tokens with q > 0 = p and p > 0 = q both occur)."""
    p, q = random_dist(seed, k + 1, sparsity=sparsity), random_dist(100 + seed, k, sparsity=sparsity)
    first = first_emitted(rejection_sample_batch, q, p, seed)
    assert chi_square_pvalue(bincount(first), p[0].tolist()) > ALPHA


@pytest.mark.parametrize("seed,drafts", [(0, [3]), (1, [1, 5]), (2, [0, 0, 7]), (3, [2, 6])])
def test_first_token_has_target_distribution_point_mass_q(seed, drafts):
    p = random_dist(seed, len(drafts) + 1, sparsity=0.3)
    first = first_emitted(rejection_sample_batch, None, p, seed, point_tokens=drafts)
    assert chi_square_pvalue(bincount(first), p[0].tolist()) > ALPHA


def test_point_mass_on_a_zero_probability_token_is_always_rejected():
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    for seed in range(50):
        n, token = rejection_sample([0], None, p, make_generator(seed))
        assert n == 0 and token in (1, 2)


# ----------------------------------------------------------------------------------------------
# Harness 2: a Markov "language model" so that p_i depends on the drafted prefix, as it does for a
# real target. State S = V is the start; P[s] is the target's next-token distribution after s,
# Q[s] the draft's. The engine loop below runs speculative steps until two tokens are committed;
# their joint distribution must be P[S](x1) · P[x1](x2).


def first_two_emitted(sampler, P: torch.Tensor, Q: torch.Tensor, k: int, seed: int, point_mass: bool,
                      trials: int = TRIALS) -> torch.Tensor:
    gen = make_generator(seed)
    prev = torch.full((trials,), V)  # last committed token (start state)
    emitted: list[torch.Tensor] = []
    todo = torch.arange(trials)  # trials still short of two committed tokens
    out = torch.full((trials, 2), -1)
    while todo.numel():
        state = prev[todo]
        drafts = []
        for _ in range(k):  # chain drafting from the draft model (sampled, or its argmax)
            nxt = Q[state].argmax(-1) if point_mass else sample_rows(Q[state], gen)
            drafts.append(nxt)
            state = nxt
        tokens = torch.stack(drafts, 1)
        contexts = torch.cat([prev[todo, None], tokens], 1)  # token before each verified position
        n_acc, nxt = sampler(tokens, None if point_mass else Q[contexts[:, :k]], P[contexts], gen)
        committed = torch.cat([tokens, torch.full_like(nxt, -1)[:, None]], 1)
        committed[torch.arange(todo.numel()), n_acc] = nxt  # d_1..d_n, then the correction/bonus
        lengths = n_acc + 1
        have = (out[todo] >= 0).sum(1)
        for j in range(2):  # append committed tokens to each trial's output, up to two
            slot = have + j
            fill = (j < lengths) & (slot < 2)
            out[todo[fill], slot[fill]] = committed[fill, j]
        prev[todo] = committed[torch.arange(todo.numel()), n_acc]
        todo = todo[(out[todo] < 0).any(1)]
    return out[:, 0] * V + out[:, 1]


def markov_pair(seed: int, sparsity: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    P = random_dist(seed, V + 1, sparsity=sparsity)  # rows 0..V-1: after token s; row V: start
    Q = random_dist(seed + 50, V + 1, sparsity=sparsity)
    return P, Q


def exact_pairs(P: torch.Tensor) -> list[float]:
    return (P[V][:, None] * P[:V]).reshape(-1).tolist()  # P(x1) · P(x2 | x1)


@pytest.mark.parametrize("k,point_mass,sparsity,seed", [
    (1, False, 0.0, 0), (2, False, 0.0, 1), (3, False, 0.3, 2), (2, True, 0.0, 3), (3, True, 0.3, 4),
])
def test_first_two_tokens_have_target_joint_distribution(k, point_mass, sparsity, seed):
    """Covers acceptance of d_1 then d_2, rejection at either position, and the bonus token (k=1)."""
    P, Q = markov_pair(seed, sparsity)
    pairs = first_two_emitted(rejection_sample_batch, P, Q, k, seed, point_mass)
    exact = exact_pairs(P)
    counts = bincount(pairs, V * V)
    assert all(c == 0 for c, e in zip(counts, exact) if e == 0)
    assert chi_square_pvalue(counts, exact) > ALPHA


# ----------------------------------------------------------------------------------------------
# Bonus path, the single-sequence wrapper, k = 0, guards.


def test_identical_p_and_q_accept_everything_and_bonus_is_p_k():
    p = random_dist(7, 4)
    trials = TRIALS
    gen = make_generator(1)
    tokens = sample_rows(p[:3].expand(trials, 3, V), gen)
    n_acc, bonus = rejection_sample_batch(tokens, p[:3].expand(trials, 3, V), p.expand(trials, 4, V), gen)
    assert (n_acc == 3).all()
    assert chi_square_pvalue(bincount(bonus), p[3].tolist()) > ALPHA
    # point mass on a token the target is certain of: accepted every time too
    one_hot = torch.nn.functional.one_hot(torch.tensor([2, 5]), V).float()
    p_certain = torch.cat([one_hot, p[3:]])
    assert all(rejection_sample([2, 5], None, p_certain, make_generator(s))[0] == 2 for s in range(30))


def test_k0_samples_from_p0():
    p = random_dist(8, 1)
    n_acc, nxt = rejection_sample_batch(torch.empty(TRIALS, 0, dtype=torch.long), None, p.expand(TRIALS, 1, V), make_generator(2))
    assert (n_acc == 0).all() and chi_square_pvalue(bincount(nxt), p[0].tolist()) > ALPHA
    assert rejection_sample([], None, p, make_generator(0))[0] == 0


def test_single_sequence_wrapper_is_the_batched_sampler_with_b1():
    p, q = random_dist(9, 3, sparsity=0.3), random_dist(10, 2)
    for seed in range(40):
        tokens = [seed % V, (seed * 3) % V]
        for q_arg in (q, None):
            single = rejection_sample(torch.tensor(tokens), q_arg, p, make_generator(seed))
            n, t = rejection_sample_batch(torch.tensor([tokens]), None if q_arg is None else q_arg[None], p[None], make_generator(seed))
            assert single == (int(n), int(t))
            assert rejection_sample(tokens, q_arg, p, make_generator(seed)) == single  # list input


def test_draft_with_zero_draft_probability_is_rejected_not_divided_by_zero():
    p, q = torch.tensor([[0.5, 0.5, 0.0], [1 / 3] * 3]), torch.tensor([[1.0, 0.0, 0.0]])
    for seed in range(20):
        n, token = rejection_sample([1], q, p, make_generator(seed))
        assert n == 0 and token == 1  # residual max(p - q, 0) = [0, 0.5, 0]


def test_all_zero_residual_falls_back_to_p():
    p = torch.tensor([[0.25, 0.25, 0.5]])
    assert torch.equal(verify_module._residual(p, p.clone(), torch.tensor([0])), p)
    assert torch.equal(verify_module._residual(torch.tensor([[0.0, 1.0, 0.0]]), None, torch.tensor([1])),
                       torch.tensor([[0.0, 1.0, 0.0]]))


def test_shape_mismatches_are_errors():
    with pytest.raises(ValueError):
        rejection_sample([1, 2], None, random_dist(0, 2), make_generator(0))
    with pytest.raises(ValueError):
        rejection_sample([1, 2], random_dist(0, 1), random_dist(0, 3), make_generator(0))
    with pytest.raises(ValueError):
        greedy_verify([1, 2], torch.tensor([1, 2]))


# ----------------------------------------------------------------------------------------------
# Greedy.


def test_greedy_verify_cases():
    argmax = torch.tensor([5, 6, 7, 8])
    assert greedy_verify([5, 6, 7], argmax) == (3, 8)  # all accepted + bonus
    assert greedy_verify([1, 6, 7], argmax) == (0, 5)  # first rejected → target's token
    assert greedy_verify([5, 6, 0], argmax) == (2, 7)  # mid rejection
    assert greedy_verify([5, 0, 7], argmax) == (1, 6)  # later matches after a mismatch do not count
    assert greedy_verify(torch.tensor([5, 6, 7]), argmax) == (3, 8)
    assert greedy_verify([], argmax[:1]) == (0, 5)


def test_verify_greedy_dispatch_uses_target_argmax_and_ignores_draft_probs():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 3.0], [0.0, 0.0, 1.0]])  # argmax 1, 0 (tie → lowest), 2
    params = SamplingParams(temperature=0)
    garbage_q = torch.full((2, 3), float("nan"))
    assert verify([1, 0], garbage_q, logits, params, make_generator(0)) == (2, 2)
    assert verify([1, 2], None, logits, params, make_generator(0)) == (1, 0)


# ----------------------------------------------------------------------------------------------
# Truncated sampling through verify(): the shared transform on both sides.


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_k=3),
    SamplingParams(temperature=1.0, top_p=0.7),
    SamplingParams(temperature=1.2, top_k=5, top_p=0.9, min_p=0.05),
])
def test_truncated_sampling_through_verify(params):
    vocab = 12
    gen = torch.Generator().manual_seed(4)
    target_logits, draft_logits = torch.randn(3, vocab, generator=gen) * 2, torch.randn(2, vocab, generator=gen) * 2
    p, q = logits_to_probs(target_logits, params), logits_to_probs(draft_logits, params)
    support = p[0] > 0
    if params.top_k:
        assert int(support.sum()) <= params.top_k
    # (a) verify() is rejection sampling on logits_to_probs(target): same draws for the same seed
    sampler = make_generator(3)
    firsts = []
    for seed in range(1500):
        tokens = sample_rows(q, sampler).tolist()
        got = verify(tokens, q, target_logits, params, make_generator(seed))
        assert got == rejection_sample(tokens, q, p, make_generator(seed))
        firsts.append(tokens[0] if got[0] else got[1])
    assert all(support[t] for t in firsts)  # never a token outside the truncated set
    # (b) so its output distribution is the one of the batched sampler on the same p, q
    trials = TRIALS
    g = make_generator(5)
    tokens = sample_rows(q.expand(trials, 2, vocab), g)
    n_acc, nxt = rejection_sample_batch(tokens, q.expand(trials, 2, vocab), p.expand(trials, 3, vocab), g)
    first = torch.where(n_acc > 0, tokens[:, 0], nxt)
    counts = bincount(first, vocab)
    assert all(c == 0 for c, s in zip(counts, support.tolist()) if not s)
    assert chi_square_pvalue(counts, p[0].tolist()) > ALPHA
    # a draft from a different truncation (untransformed q) still gives p: q only changes the speed
    q_raw = torch.softmax(draft_logits, -1)
    tokens = sample_rows(q_raw.expand(trials, 2, vocab), g)
    n_acc, nxt = rejection_sample_batch(tokens, q_raw.expand(trials, 2, vocab), p.expand(trials, 3, vocab), g)
    assert chi_square_pvalue(bincount(torch.where(n_acc > 0, tokens[:, 0], nxt), vocab), p[0].tolist()) > ALPHA


# ----------------------------------------------------------------------------------------------
# Power: the same harnesses reject broken samplers, so the tests above can fail.


def test_power_correction_from_p_instead_of_residual(monkeypatch):
    """The classic bug: on rejection, sample from p rather than norm(max(p − q, 0))."""
    monkeypatch.setattr(verify_module, "_residual", lambda p, q, token: p)
    p, q = random_dist(1, 3), random_dist(101, 2)
    first = first_emitted(rejection_sample_batch, q, p, seed=1)
    assert chi_square_pvalue(bincount(first), p[0].tolist()) < ALPHA
    first = first_emitted(rejection_sample_batch, None, p, seed=1, point_tokens=[1, 5])  # d_1 not removed
    assert chi_square_pvalue(bincount(first), p[0].tolist()) < ALPHA


def test_power_inverted_acceptance_ratio():
    def broken(tokens, q, p, gen):  # accept with min(1, q/p): swap the roles of p and q at the draft rows
        k = tokens.shape[1]
        return rejection_sample_batch(tokens, p[:, :k], torch.cat([q, p[:, k:]], 1), gen)

    p, q = random_dist(2, 3), random_dist(102, 2)
    first = first_emitted(broken, q, p, seed=2)
    assert chi_square_pvalue(bincount(first), p[0].tolist()) < ALPHA


def test_power_bonus_from_the_wrong_row():
    """Off-by-one: bonus sampled from p_{k-1} instead of p_k. Only the joint test can see this."""
    def broken(tokens, q, p, gen):
        k = tokens.shape[1]
        return rejection_sample_batch(tokens, q, torch.cat([p[:, :k], p[:, k - 1:k]], 1), gen)

    P, Q = markov_pair(0)
    pairs = first_two_emitted(broken, P, Q, k=1, seed=0, point_mass=False)
    assert chi_square_pvalue(bincount(pairs, V * V), exact_pairs(P)) < ALPHA


# ----------------------------------------------------------------------------------------------
# The χ² helper itself, against closed forms of the χ² survival function.


def _chi2_sf(x: float, df: int) -> float:
    if df % 2 == 0:  # e^{-x/2} Σ_{i<df/2} (x/2)^i / i!
        return math.exp(-x / 2) * sum((x / 2) ** i / math.factorial(i) for i in range(df // 2))
    tail, term = math.erfc(math.sqrt(x / 2)), math.sqrt(2 * x / math.pi) * math.exp(-x / 2)
    for j in range(1, (df - 1) // 2 + 1):  # odd df: erfc plus the recurrence terms
        tail += term
        term *= x / (2 * j + 1)
    return tail


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 10, 31])
def test_chi_square_pvalue_matches_closed_form(df):
    from specdec.stats_tests import _upper_regularized_gamma

    for x in (0.1, 1.0, df * 0.5, float(df), df + 3.0, 3.0 * df + 10):
        assert _upper_regularized_gamma(df / 2, x / 2) == pytest.approx(_chi2_sf(x, df), rel=1e-9, abs=1e-15)


def test_chi_square_pvalue_statistic_and_edge_cases():
    # X² = (60-50)²/50 + (40-50)²/50 = 4 with 1 degree of freedom
    assert chi_square_pvalue([60, 40], [0.5, 0.5]) == pytest.approx(math.erfc(math.sqrt(2)), rel=1e-9)
    assert chi_square_pvalue([500, 500], [1, 1]) == pytest.approx(1.0)  # unnormalised probs
    assert chi_square_pvalue([10, 0, 5], [0.5, 0.0, 0.5]) > 0.1  # an empty zero-probability cell is fine
    assert chi_square_pvalue([10, 1, 5], [0.5, 0.0, 0.5]) == 0.0  # an impossible outcome is never fine
    with pytest.raises(ValueError):
        chi_square_pvalue([1, 2], [1.0])


def test_errors_module_is_the_user_error_type():
    """Verification never raises user errors; parameter validation does (documents the split)."""
    with pytest.raises(SpecdecError):
        SamplingParams(top_p=2)


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.3, top_k=50, min_p=0.01)])
def test_verify_transforms_only_the_rows_it_reaches_and_decides_as_the_batched_sampler(params):
    """``verify`` under sampling computes a row's probabilities only when the tokens before it were
    accepted (rejection_sample_rows): for every seed the same (n_accepted, next_token) as the batched
    sampler over all rows, and the generator left in the same state (the next draw is equal)."""
    vocab, k = 1000, 4
    logits = torch.randn(k + 1, vocab, generator=torch.Generator().manual_seed(5)) * 3
    q = logits_to_probs(logits[:k] + torch.randn(k, vocab, generator=torch.Generator().manual_seed(6)), params)
    likely = logits_to_probs(logits, params).argmax(-1).tolist()  # drafts the target often accepts
    outcomes = set()
    for seed in range(60):
        tokens = [likely[i] if (seed >> i) & 1 else (seed * 7 + i) % vocab for i in range(k)]
        for draft_probs in (None, q):
            lazy_gen, batched_gen = make_generator(seed), make_generator(seed)
            lazy = verify(tokens, draft_probs, logits, params, lazy_gen)
            batched = rejection_sample(tokens, draft_probs, logits_to_probs(logits, params), batched_gen)
            assert lazy == batched
            assert torch.equal(torch.rand(3, generator=lazy_gen), torch.rand(3, generator=batched_gen))
            outcomes.add(lazy[0])
    assert len(outcomes) >= 3  # rejections at several positions and full acceptances were exercised
    with pytest.raises(ValueError):
        verify([1, 2], None, logits[:2], params, make_generator(0))
