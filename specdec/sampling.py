"""Sampling parameters, the ONE logits → probabilities transform, and seeded sampling.

The same function turns the target's logits into p and the draft's logits into q before
verification (ARCHITECTURE principle 4): rejection sampling reproduces the target's distribution
only when both sides went through the same temperature / top-k / top-p / min-p. Plain decoding uses
it too, so speculative and plain sampling target literally the same distribution.

Order (as HF ``generate`` and vLLM V0): temperature → top-k → top-p → min-p, then renormalise.
(vLLM V1 applies min-p before top-k/top-p. min-p commutes with top-k, since both keep the tokens
above a logit threshold, but not with top-p; the outputs differ only when top-p and min-p are both set.)

Ties are resolved by *value*, never by sort order, so the kept set is a function of the logits alone
(identical for p and q rows, across devices and batch sizes):

* greedy (temperature 0): one-hot of the argmax (:func:`greedy_ids`) — ties → the lowest token id;
* top-k: every token whose logit is ≥ the k-th largest is kept, so a tie at the boundary keeps more
  than k tokens (as HF and vLLM do);
* top-p: the smallest prefix of the tokens sorted by probability whose mass reaches ``top_p``,
  including the token that crosses it, plus every token tied with that boundary token.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from specdec.config import is_int, is_real
from specdec.errors import SpecdecError
from specdec.structured import StructuredOutput


#: the most alternatives per token ``logprobs`` may ask for (OpenAI's limit for top_logprobs)
MAX_LOGPROBS = 20


@dataclass
class TokenLogprob:
    """One emitted token's log-probability under the target's raw distribution (log-softmax of
    its logits, before temperature / top-k / top-p: what the model believes, as vLLM reports by
    default) and the ``top`` most likely tokens as ``(token id, log-probability)``. Speculation
    does not change it: the row comes from the verification forward, whose logits are the plain
    step's (bit-identical in the int4/int8 modes)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    #: 1 + how many tokens the model found likelier (vLLM's ``rank``)
    rank: int = 1


def token_logprobs(logits: torch.Tensor, token_ids: list[int], top: int) -> list[TokenLogprob]:
    """``logits [>= len(token_ids), V]`` (row i scored token i) → one :class:`TokenLogprob` per token."""
    rows = torch.log_softmax(logits[: len(token_ids)].float(), dim=-1)
    result = []
    for row, token in zip(rows, token_ids):
        best = torch.topk(row, top) if top else None
        alternatives = [] if best is None else list(zip(best.indices.tolist(), best.values.tolist()))
        result.append(TokenLogprob(token, float(row[token]), alternatives, int((row > row[token]).sum()) + 1))
    return result


@dataclass
class SamplingParams:
    """How to pick each token and when to stop, vLLM's names and meanings: ``temperature`` (0 = greedy,
    the exact argmax path), ``top_k`` / ``top_p`` / ``min_p`` (off at 0 / 1 / 0), ``seed`` (reproducible
    sampling), ``max_tokens``, ``stop`` strings and ``stop_token_ids``, ``ignore_eos``, ``min_tokens``,
    ``logprobs`` / ``prompt_logprobs``, penalties and ``logit_bias``, ``structured`` output and a
    ``prediction`` (the comments on each field below say more). Speculation never changes what they
    produce: greedy output is token-identical to plain decoding, sampled output has the same distribution."""

    temperature: float = 1.0  # 0 => greedy (exact argmax path)
    top_k: int = 0  # 0 or -1 => off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 128
    stop: list[str] = field(default_factory=list)  # stop strings (handled by the engine)
    #: token ids that end the output, kept in it as vLLM keeps them (text too, unless special); the model's own
    #: end-of-sequence ids end it without being output
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    #: None: no log-probabilities; N (0..MAX_LOGPROBS): each emitted token's log-probability under
    #: the target's raw distribution, plus its N most likely alternatives (OpenAI ``logprobs``)
    logprobs: int | None = None
    #: None, or N (0..MAX_LOGPROBS): each *prompt* token's log-probability after the tokens before it
    #: and its N likeliest alternatives (vLLM's ``prompt_logprobs``; the server's ``echo`` with
    #: ``logprobs``). The prompt pass then scores every row and skips the prefix cache.
    prompt_logprobs: int | None = None
    #: constrain the output to a JSON schema / JSON object / regex / choice / grammar
    #: (:mod:`specdec.structured`); exact under speculation: the same mask reaches p and q
    structured: StructuredOutput | None = None
    #: OpenAI's penalties, over the output's tokens: ``presence_penalty`` is subtracted from the logit of
    #: every token the output holds, ``frequency_penalty`` once per occurrence ([-2, 2], 0 = off);
    #: vLLM's / HF's ``repetition_penalty`` divides the positive logits (multiplies the negative ones)
    #: of every token in the prompt or the output (> 0, 1 = off); ``logit_bias`` adds to the logits of
    #: the token ids it names ([-100, 100]). Exact under speculation (:mod:`specdec.penalties`).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    #: vLLM's: the stop tokens (end of sequence, ``stop_token_ids``) cannot be generated, nor stop
    #: strings end the output, before it holds this many tokens
    min_tokens: int = 0
    #: OpenAI's Predicted Outputs: text (or its token ids) the output is expected to largely repeat —
    #: a file being edited, an earlier answer being revised. Drafters that read text (``suffix``,
    #: ``draft_suffix``, ``ngram``) also draft from it; the output is the same with or without it (a drafted token
    #: is only ever a proposal), only faster where the prediction is right.
    prediction: str | list[int] | None = None
    #: vLLM's: the stop string that ended the output stays in its text (OpenAI's behaviour drops it)
    include_stop_str_in_output: bool = False
    #: vLLM's: special tokens the model generates (``<|im_start|>``, FIM markers …) are left out of the text
    #: (True, the default) or written in it; the token ids hold them either way
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # a single stop string, as the OpenAI API allows
            self.stop = [self.stop]
        if not is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise SpecdecError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not is_int(self.top_k) or self.top_k < -1:
            raise SpecdecError(f"top_k must be a positive integer, or 0 / -1 for off, got {self.top_k!r}")
        if not is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise SpecdecError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not is_real(self.min_p) or not 0.0 <= self.min_p < 1.0:
            raise SpecdecError(f"min_p must be in [0, 1) (0 = off), got {self.min_p!r}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise SpecdecError(f"seed must be an integer in [0, 2**63) or None, got {self.seed!r}")
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise SpecdecError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.stop, (list, tuple)) or any(not isinstance(s, str) or not s for s in self.stop):
            raise SpecdecError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        for name, value in (("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)):
            if value is not None and (not is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise SpecdecError(f"{name} must be an integer in [0, {MAX_LOGPROBS}] or None, got {value!r}")
        for name, flag in (("ignore_eos", self.ignore_eos), ("include_stop_str_in_output", self.include_stop_str_in_output),
                           ("skip_special_tokens", self.skip_special_tokens)):
            if not isinstance(flag, bool):  # "yes" (or "no") was taken as true
                raise SpecdecError(f"{name} must be True or False, got {flag!r}")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise SpecdecError(f"structured must be a specdec.StructuredOutput, got {type(self.structured).__name__}")
        if not isinstance(self.stop_token_ids, (list, tuple)) or any(not is_int(t) or t < 0 for t in self.stop_token_ids):
            raise SpecdecError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        if self.prediction is not None and not isinstance(self.prediction, str) and (
                not isinstance(self.prediction, list) or any(not is_int(t) or t < 0 for t in self.prediction)):
            raise SpecdecError(f"prediction must be text or a list of token ids (integers >= 0), got {self.prediction!r:.80}")
        self._check_penalties()

    def _check_penalties(self) -> None:
        """OpenAI's ranges for its penalties and logit bias (a value outside is refused, as the API does)."""
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise SpecdecError(f"min_tokens must be an integer in [0, max_tokens = {self.max_tokens}], got {self.min_tokens!r}")
        for name, value in (("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)):
            if not is_real(value) or not -2.0 <= value <= 2.0:
                raise SpecdecError(f"{name} must be a number in [-2, 2] (0 = off), got {value!r}")
        if not is_real(self.repetition_penalty) or not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise SpecdecError(f"repetition_penalty must be a finite number > 0 (1 = off), got {self.repetition_penalty!r}")
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise SpecdecError(f"logit_bias must map token ids to numbers, got {type(self.logit_bias).__name__}")
        for token, bias in (self.logit_bias or {}).items():
            if not is_int(token) or token < 0:
                raise SpecdecError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not is_real(bias) or not -100.0 <= bias <= 100.0:
                raise SpecdecError(f"logit_bias values must be numbers in [-100, 100], got {bias!r} for token {token}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """Whether a logit bias, a penalty or min_tokens is set (then each row depends on the tokens
        before it: :mod:`specdec.penalties`)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0 or self.logit_bias
                    or self.min_tokens)

    @property
    def is_seeded_sampling(self) -> bool:
        """Sampling whose text must be the same on every run — plain decoding's with that seed, whatever
        drafts: each position's token is chosen from its own seeded clocks (:mod:`specdec.seeded`)."""
        return not self.is_greedy and self.seed is not None


#: :func:`greedy_ids`, :func:`top_candidates` and :func:`inverse_cdf` scan a CPU row of a vocabulary
#: in blocks of this many entries (vectorised block reductions, then one block)
VOCAB_BLOCK = 128


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """``[..., V]`` logits → LongTensor ``[...]``: ``torch.argmax`` over the last dimension, the same
    index for every input (ties → the lowest id, a NaN wins as in ``torch.argmax``), faster on a CPU.

    Why: on a CPU ``torch.argmax`` over a 152 k vocabulary takes 0.3 ms a row (2 threads here) —
    ~5× the time of a softmax over the same row — and every greedy token pays it: a plain step, each
    draft step, each verified row (a 9-node tree: 1.8 ms a round). ``amax`` is vectorised, so: the
    maximum of each block of VOCAB_BLOCK logits, the first block holding the row's maximum, then
    the first maximum inside that block — the row's first maximum (0.07 ms a row; 0.33 ms for 9)."""
    vocab = logits.shape[-1]
    if logits.device.type != "cpu" or vocab < 4 * VOCAB_BLOCK:
        return logits.argmax(-1)
    rows = logits.reshape(-1, vocab)
    whole = vocab - vocab % VOCAB_BLOCK
    block_max = rows[:, :whole].reshape(rows.shape[0], -1, VOCAB_BLOCK).amax(-1)  # [R, blocks]
    if whole < vocab:  # the last, shorter block
        block_max = torch.cat([block_max, rows[:, whole:].amax(-1, keepdim=True)], dim=-1)
    start = block_max.argmax(-1) * VOCAB_BLOCK  # [R]
    # ids past the vocabulary (a shorter last block) read its last logit again: they come after it,
    # so they never change which is the first maximum
    ids = (start.unsqueeze(-1) + torch.arange(VOCAB_BLOCK, device=logits.device)).clamp(max=vocab - 1)
    return (start + rows.gather(-1, ids).argmax(-1)).reshape(logits.shape[:-1])


def top_candidates(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., V]`` → (values, ids) ``[..., k]`` of the k largest, descending: ``torch.topk``'s
    values, faster on a CPU (0.55 → 0.09 ms for 3 of a 152 k row here). Among tied values the ids
    may come in another order than ``torch.topk``'s — callers rank draft candidates with them,
    which moves speed, never an output.

    The k largest lie in the k blocks with the largest block maxima (a block holding the j-th
    largest has at most j − 1 blocks with a larger maximum), so only those k × VOCAB_BLOCK logits
    are ranked. Vocabularies that are not whole blocks, small ones and large k use ``torch.topk``."""
    vocab = scores.shape[-1]
    if scores.device.type != "cpu" or vocab % VOCAB_BLOCK or vocab < 4 * VOCAB_BLOCK * k or k > 8:
        top = torch.topk(scores, k, dim=-1)
        return top.values, top.indices
    rows = scores.reshape(-1, vocab)
    block_max = rows.reshape(rows.shape[0], -1, VOCAB_BLOCK).amax(-1)  # [R, blocks]
    blocks = torch.topk(block_max, k, dim=-1).indices.sort(-1).values  # [R, k], ascending
    ids = (blocks.unsqueeze(-1) * VOCAB_BLOCK + torch.arange(VOCAB_BLOCK)).reshape(rows.shape[0], -1)
    top = torch.topk(rows.gather(-1, ids), k, dim=-1)
    shape = (*scores.shape[:-1], k)
    return top.values.reshape(shape), ids.gather(-1, top.indices).reshape(shape)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[..., V]`` logits (any float dtype) → float32 probabilities, row by row.

    Works on a whole verification chunk ``[k+1, V]`` at once; rows never interact. Filtered tokens
    get probability exactly 0, so a token outside the kept set can never be sampled or accepted.
    Greedy returns the one-hot of the argmax (ties → lowest id) and ignores the other filters.
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    if params.is_greedy:
        return torch.nn.functional.one_hot(greedy_ids(logits), vocab).float()
    # Shift by the row max before dividing so a tiny temperature cannot overflow to inf - inf = NaN.
    logits = (logits - logits.amax(-1, keepdim=True)) / params.temperature
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = probs.masked_fill(probs < _top_p_boundary(probs, params.top_p), 0.0)  # ties stay
    if params.min_p > 0.0:
        # Relative to the most likely token; scale-free, so it needs no renormalisation first.
        probs = probs.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), 0.0)
    return probs / probs.sum(-1, keepdim=True)


#: ``torch.topk`` windows tried, on CPU, before a full sort when locating the top-p boundary
_TOP_P_WINDOWS = (256, 4096)


def _nucleus(sorted_probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """On descending rows: (tokens in the nucleus ``[..., 1]``, probability of its last token)."""
    # Mass strictly before each sorted token, in float64 so long vocabularies do not drift.
    mass_before = sorted_probs.double().cumsum(-1) - sorted_probs.double()
    n_keep = (mass_before < top_p).sum(-1, keepdim=True)  # ≥ 1: mass_before[0] == 0 < top_p
    return n_keep, sorted_probs.gather(-1, n_keep - 1)


def _top_p_boundary(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Per row, the probability of the token whose mass brings the sorted prefix to ``top_p``.

    Sorting a 150k vocabulary for every verified row costs as much as a small model's forward on a
    CPU, yet the nucleus nearly always lies among the few hundred largest tokens. ``torch.topk``
    returns the same descending values as the sort, so when the boundary falls strictly inside
    the window (``n_keep < window`` on every row) the result is identical; otherwise widen, and
    finally sort. On accelerators sort directly: it is cheap there and needs no host sync.
    """
    if probs.device.type == "cpu":
        for window in _TOP_P_WINDOWS:
            if window >= probs.shape[-1]:
                break
            n_keep, boundary = _nucleus(torch.topk(probs, window, dim=-1).values, top_p)
            if bool((n_keep < window).all()):
                return boundary
    return _nucleus(torch.sort(probs, dim=-1, descending=True).values, top_p)[1]


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A private generator per request: reproducible with a seed, independent of the global RNG.

    ``None`` seeds from ``os.urandom``, so two unseeded requests never share a stream. The generator
    must live on the device of the probabilities it samples (CUDA generators differ from CPU ones).
    """
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
    return generator


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token ids for ``uniforms`` in [0, 1) under ``[..., V]`` weights (not necessarily normalised).

    Token i is returned iff ``cdf[i-1] <= u * total < cdf[i]``, so a zero-weight token (``cdf[i-1]
    == cdf[i]``) can never be returned. The cumulative sums are in float64: the rounding bias per
    token is ~1e-16, far below anything a test or a user can observe.

    On a CPU the sums run by blocks (:func:`_blocked_inverse_cdf`): a float64 ``cumsum`` over 152 k
    ids is sequential and took 1.4 ms of every sampled token here (a 45–55 ms step); block totals,
    their cumulative sum and one block's own cumulative sum take ~0.15 ms.
    """
    vocab = probs.shape[-1]
    if probs.device.type == "cpu" and vocab % VOCAB_BLOCK == 0 and vocab >= 4 * VOCAB_BLOCK:
        return _blocked_inverse_cdf(probs, uniforms)
    cdf = probs.double().cumsum(-1)
    total = cdf[..., -1]
    u = uniforms.double() * total
    # u < total in exact arithmetic; rounding of the product can land on it, past the last token
    # with weight. Clamping to the float just below keeps the result on a token with weight.
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u.unsqueeze(-1), right=True).squeeze(-1)


def _blocked_inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """:func:`inverse_cdf` in two searches: the block whose cumulative total first exceeds u, then
    the token inside it whose cumulative weight from the block's start first exceeds what is left
    of u. Where rounding puts u at or past the block's own summed weight (~1e-16 of the time), the
    block's last token with weight is taken: never a zero-weight token."""
    vocab = probs.shape[-1]
    weights = probs.reshape(-1, vocab // VOCAB_BLOCK, VOCAB_BLOCK).double()  # [R, blocks, B]
    rows = torch.arange(weights.shape[0])
    block_cdf = weights.sum(-1).cumsum(-1)  # [R, blocks]
    total = block_cdf[:, -1]
    u = torch.minimum(uniforms.reshape(-1).double() * total, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(block_cdf, u.unsqueeze(-1), right=True).squeeze(-1).clamp(max=block_cdf.shape[1] - 1)
    before = torch.where(block > 0, block_cdf[rows, (block - 1).clamp(min=0)], torch.zeros_like(u))
    inside = weights[rows, block]  # [R, B]
    offset = torch.searchsorted(inside.cumsum(-1), (u - before).unsqueeze(-1), right=True).squeeze(-1)
    last_with_weight = VOCAB_BLOCK - 1 - (inside > 0).flip(-1).int().argmax(-1)
    offset = torch.where(offset >= VOCAB_BLOCK, last_with_weight, offset)
    return (block * VOCAB_BLOCK + offset).reshape(probs.shape[:-1])


def sample_rows(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``[..., V]`` weights → LongTensor ``[...]``; one uniform per row.

    Inverse CDF with ``torch.rand(generator=...)``: exact, reproducible for a seed and a batch
    shape, and one call for a whole batch (``torch.multinomial`` draws differently per backend).
    """
    uniforms = torch.rand(probs.shape[:-1], generator=generator, dtype=torch.float64, device=probs.device)
    return inverse_cdf(probs, uniforms)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a ``[V]`` distribution (see :func:`sample_rows`)."""
    return int(sample_rows(probs, generator))
