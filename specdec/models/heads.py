"""Drafting heads that read the target's own hidden states: the EAGLE feature head (Li et al. 2024)
and Medusa heads (Cai et al. 2024).

An EAGLE head is one decoder layer that extrapolates the target's features: at position ``i`` it
reads the target's final hidden state ``f_i`` (before the final norm) and the embedding of the next
token ``x_{i+1}``, and predicts ``f_{i+1}``; the *target's* final norm and LM head (restricted to the
first ``draft_vocab_size`` ids, FR-Spec) turn that into a distribution over ``x_{i+2}``. Drafting
continues on its own predicted features. It reads ~1/20 of a target step's bytes and needs no
prompt pass of a model of its own: the target's prefill already computed every feature it reads
(:meth:`specdec.models.kv_cache.KVCache.record_features`).

Medusa heads are K residual blocks on the target's last hidden state (after its final norm): block
k predicts the token k+1 positions after the one the target's own LM head predicts, all at once —
no autoregressive draft steps, and each block reads H×H weights (+ the LM head rows). Multi-token
prediction (MTP) heads have the same shape.

A trained head is a directory: ``config.json`` (:class:`HeadConfig`: its shape and the target it was
trained on) and ``model.safetensors`` (:mod:`specdec.models.head_files`). ``specdec train-drafter``
writes one (:mod:`specdec.train`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from specdec.errors import SpecdecError
from specdec.models.config import ModelConfig
from specdec.models.kv_cache import KVCache
from specdec.models.transformer import DecoderLayer, rope_tables

HEAD_KINDS = ("eagle", "medusa")
DRAFT_VOCABS = ("first", "frequency")


@dataclass(frozen=True)
class HeadConfig:
    """A head's shape and what it was trained for. ``target`` names the target's shape (arch, hidden
    size, vocabulary, layers) so a head is refused on a model it does not fit; ``training`` records
    how it was made (data, tokens, minutes) for the user to read."""

    kind: str
    hidden_size: int
    vocab_size: int  # the target's vocabulary (token ids the embedding reads)
    draft_vocab_size: int  # ids the head scores: 0 .. draft_vocab_size-1 (BPE ids are frequency-ranked)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    num_medusa_heads: int = 0  # medusa: K blocks (drafts up to K tokens per round)
    #: which ids the head scores: "first" — ids 0 .. draft_vocab_size-1 (BPE ids come roughly in
    #: frequency order); "frequency" — the draft_vocab_size ids most frequent in its training data,
    #: kept with its weights as ``draft_ids`` (EAGLE-3's draft vocabulary): on code the first 32768
    #: ids miss 5–8 % of the target's tokens, which a head can then never draft
    draft_vocab: str = "first"
    #: the target layers whose hidden states the head reads, side by side (the residual stream
    #: entering each; ``num_layers``: the final hidden state, which comes last): EAGLE-1/2 and Medusa
    #: read the final one; EAGLE-3 fuses a low, a middle and the final one (:func:`fused_layers`).
    #: Empty in configs written before the field: the final one (:attr:`read_layers`)
    feature_layers: tuple[int, ...] = ()
    target: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_target(cls, target: ModelConfig, draft_vocab_size: int = 32768, intermediate_size: int | None = None,
                   kind: str = "eagle", num_medusa_heads: int = 4, draft_vocab: str = "first",
                   feature_layers: Sequence[int] = ()) -> "HeadConfig":
        """A head for ``target``: its attention shape and RoPE, a smaller MLP (2× hidden by default:
        the head must cost a small fraction of a target step) and ``draft_vocab_size`` ids to score
        (``draft_vocab``: the first ones, or the most frequent); ``num_medusa_heads`` for kind ``medusa``;
        ``feature_layers`` for kind ``eagle`` (default: the final layer's)."""
        if kind not in HEAD_KINDS:
            raise SpecdecError(f"unknown head kind {kind!r}; available: {', '.join(HEAD_KINDS)}")
        if draft_vocab not in DRAFT_VOCABS:
            raise SpecdecError(f"unknown draft vocabulary {draft_vocab!r}; available: {', '.join(DRAFT_VOCABS)}")
        layers = tuple(feature_layers) or (target.num_layers,)
        check_feature_layers(layers, target.num_layers, kind)
        return cls(kind=kind, hidden_size=target.hidden_size, vocab_size=target.vocab_size,
                   draft_vocab_size=min(draft_vocab_size, target.vocab_size) if draft_vocab_size > 0 else target.vocab_size,
                   num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
                   intermediate_size=intermediate_size or 2 * target.hidden_size, rope_theta=target.rope_theta,
                   rms_norm_eps=target.rms_norm_eps, max_position_embeddings=target.max_position_embeddings,
                   num_medusa_heads=num_medusa_heads if kind == "medusa" else 0, draft_vocab=draft_vocab,
                   feature_layers=layers, target=target_signature(target))

    @property
    def read_layers(self) -> tuple[int, ...]:
        """:attr:`feature_layers`, the final layer where a config predates them."""
        return tuple(self.feature_layers) or (self.target["num_layers"],)

    def layer_config(self) -> ModelConfig:
        """The head's decoder layer as a one-layer :class:`ModelConfig` (the target's layer code runs it)."""
        return ModelConfig(arch="qwen2", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=1, num_heads=self.num_heads,
                           num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                           max_position_embeddings=self.max_position_embeddings, rope_theta=self.rope_theta,
                           rms_norm_eps=self.rms_norm_eps, attention_bias=True)

    def check_target(self, target: ModelConfig) -> None:
        """A clear error when this head was trained for another model than ``target``."""
        expected = self.target
        actual = target_signature(target)
        different = {key: (expected.get(key), actual[key]) for key in actual if key in expected and expected[key] != actual[key]}
        if different:
            detail = ", ".join(f"{key}: head {head!r} vs target {got!r}" for key, (head, got) in different.items())
            raise SpecdecError(f"this {self.kind} head was trained for another target model ({detail}); "
                               "train one for this model with `specdec train-drafter`")


def fused_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's feature layers (Li et al. 2025): the residual stream entering layer 2 (low), the
    middle one and the final hidden state (high). vLLM's EAGLE-3 reads layer L−3's input as its high
    feature; the final one here, because the token loss's targets and Medusa read it: one recording
    serves every head kind (:mod:`specdec.train.data`)."""
    return tuple(sorted({min(2, num_layers), max(1, num_layers // 2), num_layers}))


def check_feature_layers(layers: Sequence[int], num_layers: int, kind: str) -> None:
    """A clear error for feature layers a ``kind`` head cannot read: they ascend within 1 ..
    ``num_layers`` and end with the final one (the token loss reads the final hidden state);
    Medusa's blocks read the final one alone."""
    if (not layers or list(layers) != sorted(set(layers)) or layers[0] < 1 or layers[-1] != num_layers):
        raise SpecdecError(f"feature layers {list(layers)} must ascend within 1 .. {num_layers} and end with "
                           f"{num_layers} (the final hidden state)")
    if kind == "medusa" and len(layers) > 1:
        raise SpecdecError("medusa heads read the final layer's features alone")


def register_draft_ids(head: nn.Module, config: HeadConfig) -> None:
    """``head.draft_ids [draft_vocab_size]``: the token id of each scored row, a buffer saved with the
    weights, for a ``"frequency"`` draft vocabulary; None for ``"first"`` (row i is id i)."""
    ids = torch.arange(config.draft_vocab_size) if config.draft_vocab == "frequency" else None
    head.register_buffer("draft_ids", ids)


def target_signature(cfg: ModelConfig) -> dict[str, Any]:
    """What a head depends on in its target: the feature size, the vocabulary and the depth."""
    return {"arch": cfg.arch, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, "num_layers": cfg.num_layers}


class EagleHead(nn.Module):
    """``fc([f_i; e(x_{i+1})]) → decoder layer → f̂_{i+1}`` (see module doc). The embedding, final
    norm and LM head are the target's and are not part of the head (frozen; passed in). A head that
    reads several of the target's layers (EAGLE-3) first fuses them into ``f_i`` (:meth:`target_feature`);
    its own predictions, read by its later draft steps, are one feature wide already."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        layers = len(config.read_layers)
        #: EAGLE-3: the target's features at several layers → one feature; None: the final layer's alone
        self.fuse = nn.Linear(layers * hidden, hidden, bias=False) if layers > 1 else None
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = DecoderLayer(config.layer_config(), 0)
        register_draft_ids(self, config)
        cos, sin = rope_tables(config.head_dim, config.max_position_embeddings, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_residual(self, scale: float = 0.02) -> "EagleHead":
        """Start as "the next feature is this feature": fc passes the feature half through (identity)
        and reads the token half through small weights, so training starts from a sensible guess."""
        hidden = self.config.hidden_size
        with torch.no_grad():
            if self.fuse is not None:  # starts as the final layer's feature, which comes last
                self.fuse.weight.zero_()
                self.fuse.weight[:, -hidden:] = torch.eye(hidden)
            self.fc.weight.zero_()
            self.fc.weight[:, :hidden] = torch.eye(hidden)
            self.fc.weight[:, hidden:].normal_(0.0, scale)
            self.fc.bias.zero_()
            for name, param in self.layer.named_parameters():
                if "norm" in name:
                    param.fill_(1.0)
                elif param.dim() == 2:
                    param.normal_(0.0, scale)
                else:
                    param.zero_()
        return self

    def init_from_layer(self, weights: dict[str, torch.Tensor]) -> "EagleHead":
        """Start the decoder layer from a trained one (``weights``: a DecoderLayer state dict of this
        head's shape, e.g. :func:`specdec.train.target_parts.last_layer_weights`); fc and fuse keep
        :meth:`init_residual`'s start."""
        with torch.no_grad():
            self.layer.load_state_dict({name: weights[name].to(param.dtype) for name, param in self.layer.state_dict().items()})
        return self

    def target_feature(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features ``[T, hidden × len(read_layers)]`` → the head's input ``f_i`` ``[T, hidden]``."""
        return features if self.fuse is None else self.fuse(features)

    def new_cache(self, max_seq_len: int) -> KVCache:
        cfg = self.config
        return KVCache(1, cfg.num_kv_heads, cfg.head_dim, max_seq_len, self.rope_cos.dtype, self.rope_cos.device)

    def forward(self, features: torch.Tensor, token_embeds: torch.Tensor, positions: torch.Tensor,
                cache: "KVCache | AppendCache", mask: torch.Tensor | None = None,
                slots: torch.Tensor | None = None) -> torch.Tensor:
        """``features [T, hidden]`` (f_i), ``token_embeds [T, hidden]`` (e(x_{i+1})), ``positions [T]``
        (i) appended to ``cache`` → predicted next features ``[T, hidden]`` (f̂_{i+1}), before the
        target's final norm. ``mask [T, cached+T]`` (bool, True = visible): which cache slots each row
        attends to; None = causal. Training unrolls draft steps with it (:func:`unroll_mask`).
        ``slots [T]`` (a step recorded as a CUDA graph, drafters/eagle_graph.py): write the keys and
        values at those slots and attend over the whole cache under ``mask [T, capacity]``; the caller
        moves ``cache.seq_len`` (as ``Decoder.forward``'s ``static_cache``)."""
        seq = features.shape[0]
        x = self.fc(torch.cat([features, token_embeds], dim=-1))
        dtype = x.dtype
        start = cache.reserve(seq) if slots is None else slots
        cos, sin = self.rope_cos[positions].to(dtype), self.rope_sin[positions].to(dtype)
        out = self.layer(x, cos, sin, cache, start, mask)
        if slots is None:
            cache.advance(seq)
        return out

    def unroll(self, features: torch.Tensor, token_embeds: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training's view of ``steps`` draft steps at every position at once (EAGLE-3's
        training-time test): ``features [T, hidden × len(read_layers)]`` (the target's, for f_0..f_{T-1}),
        ``token_embeds [T, hidden]`` (e(x_1)..e(x_T)) → per step ``[T, hidden]``. Step 0 is
        teacher-forced; step s reads step s−1's prediction at the position before (f̂_p) and attends
        as drafting does (:func:`unroll_mask`), so row p of step s equals what a drafting round whose
        last real feature is at p−s computes at its (s+1)-th token. Rows p < s have no such round
        (they read a real f_0; ignore them)."""
        features = self.target_feature(features)
        pairs = features.shape[0]
        positions = torch.arange(pairs, device=features.device)
        cache = AppendCache()
        outputs: list[torch.Tensor] = []
        inputs = features
        for step in range(min(steps, pairs)):
            mask = unroll_mask(pairs, step, features.device) if step else None
            outputs.append(self(inputs, token_embeds, positions, cache, mask))
            inputs = torch.cat([features[:1], outputs[-1][:-1]])
        return outputs

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.parameters(), *self.buffers()]
                   if t is not self.rope_cos and t is not self.rope_sin)


class AppendCache:
    """The head layer's keys/values grown by concatenation: training's unrolled steps backpropagate
    through keys that later steps read, which :class:`KVCache`'s in-place slot writes would
    invalidate. Only what :class:`~specdec.models.transformer.Attention` uses of a cache."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None  # [1, kv_heads, S, head_dim]
        self.v: torch.Tensor | None = None
        self.seq_len = 0

    def reserve(self, num_new: int) -> int:
        return self.seq_len

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append ``[kv_heads, T, head_dim]`` keys/values (``start`` must be the current end)."""
        if layer != 0 or start != self.seq_len:
            raise ValueError("an AppendCache holds one layer, written at its end")
        self.k = keys[None] if self.k is None else torch.cat([self.k, keys[None]], dim=2)
        self.v = values[None] if self.v is None else torch.cat([self.v, values[None]], dim=2)

    def advance(self, num_new: int) -> None:
        self.seq_len += num_new


def unroll_mask(pairs: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """``[pairs, (step+1)·pairs]`` visibility for draft step ``step`` (0-based) of an unrolled
    training pass (EAGLE-3's training-time test). Step s's rows sit in cache slots
    ``s·pairs .. s·pairs+pairs-1``, one per position; row p of step s is what drafting computes
    when the last real feature is at position p−s: it sees step 0's slots (real features) at
    positions ≤ p−s, and step r's slot at position p−s+r for r = 1..s (its own predicted chain,
    its own slot last) — exactly the head's cache at that point of a drafting round."""
    rows = torch.arange(pairs, device=device)
    mask = torch.zeros(pairs, (step + 1) * pairs, dtype=torch.bool, device=device)
    mask[:, :pairs] = rows[None, :] <= (rows - step)[:, None]
    for r in range(1, step + 1):
        position = rows - step + r
        valid = position >= 0
        mask[rows[valid], r * pairs + position[valid]] = True
    return mask


class MedusaHeads(nn.Module):
    """K residual blocks ``h + SiLU(W_k h + b_k)`` on the target's normed last hidden state ``h``;
    the target's LM head rows score each (not part of the head: passed in)."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        if config.num_medusa_heads < 1:
            raise SpecdecError("a medusa head needs num_medusa_heads >= 1")
        self.config = config
        self.blocks = nn.ModuleList(ResidualBlock(config.hidden_size) for _ in range(config.num_medusa_heads))
        register_draft_ids(self, config)

    def init_residual(self, scale: float = 0.0) -> "MedusaHeads":
        """Medusa's initialisation: zero weights, so every block starts as the target's own head."""
        with torch.no_grad():
            for block in self.blocks:
                block.linear.weight.normal_(0.0, scale) if scale else block.linear.weight.zero_()
                block.linear.bias.zero_()
        return self

    def forward(self, normed: torch.Tensor) -> torch.Tensor:
        """``normed [T, hidden]`` → ``[K, T, hidden]``: block k's hidden state for the token k+1
        positions after the target's own next token."""
        return torch.stack([block(normed) for block in self.blocks])

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.parameters(), *self.buffers()])


class ResidualBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.silu(self.linear(x))


DraftHead = EagleHead | MedusaHeads


def new_head(config: HeadConfig, draft_ids: torch.Tensor | None = None) -> DraftHead:
    """An untrained head of ``config.kind``, initialised as each method starts (see init_residual);
    ``draft_ids [draft_vocab_size]``: the ids it scores, for a ``"frequency"`` draft vocabulary."""
    head = (EagleHead(config) if config.kind == "eagle" else MedusaHeads(config)).init_residual()
    if (draft_ids is None) != (head.draft_ids is None):
        raise SpecdecError(f"a {config.draft_vocab!r} draft vocabulary {'needs' if draft_ids is None else 'takes no'} draft ids")
    if draft_ids is not None:
        head.draft_ids.copy_(draft_ids)
    return head
