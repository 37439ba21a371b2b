"""A compact decoder for the Llama family (Llama, SmolLM2, Qwen2), readable top to bottom.

The variants differ only by config flags (QKV bias, tied LM head, RoPE base, GQA ratio), so one file
serves them all. What speculative decoding needs from a model, and what generic implementations make
awkward, is first-class here:

* ``forward`` takes explicit ``positions`` and returns logits for *every* input position (or the
  last ``num_logits``), because verification scores all drafted tokens in one pass;
* an optional boolean ``attn_mask`` over the cached + new positions (tree attention);
* an optional subset of ``layers`` to run (self-speculation by layer skipping: skipped layers pass
  the residual stream through);
* the final hidden states on request (feature-level drafters such as EAGLE or Medusa heads).

Parameter names follow HF transformers (``model.layers.0.self_attn.q_proj.weight`` …) so HF
checkpoints load without a mapping table and transformers can serve as the reference in tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specdec.huge_pages import move_to_huge_pages
from specdec.models.config import ModelConfig
from specdec.models.kv_cache import KVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op (same result as below); a decode step runs 57 of these
            return torch.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in float32 as the reference does: bf16 variance loses too much precision.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(head_dim: int, max_positions: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[max_positions, head_dim]`` in float32 for the half-rotation RoPE layout of HF."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [heads, T, head_dim]`` by per-position ``cos/sin [T, head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


#: Chunks up to this many tokens use row-wise attention when batch invariance is on (verification
#: chunks and single-token steps); longer ones (prompt prefill) use the batched path.
ROW_WISE_MAX_TOKENS = 32


def _check_fused(module: nn.Module, fused: nn.Module | None) -> None:
    """A fused projection must produce exactly the outputs of the parts it replaces, side by side."""
    if fused is None:
        return
    expected = sum(getattr(module, name).out_features for name in module.FUSABLE_PROJECTIONS)
    produced = getattr(fused, "out_features", expected)
    if produced != expected:
        raise ValueError(f"a fused {'|'.join(module.FUSABLE_PROJECTIONS)} must have {expected} outputs, not {produced}")


class Attention(nn.Module):
    #: the projections that read the same input, in the order a fused module lays out their outputs
    FUSABLE_PROJECTIONS = ("q_proj", "k_proj", "v_proj")

    def __init__(self, cfg: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        #: compute each query row with exactly the shapes it has when decoded alone, so a token's
        #: output is bit-identical alone or inside a verification chunk (specdec/kernels/int8.py)
        self.row_wise_attention = False
        #: q|k|v as one module (one kernel call), set by :meth:`set_fused_projections`; None: three calls
        self.fused_qkv: nn.Module | None = None
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=False)

    def set_fused_projections(self, fused: nn.Module | None) -> None:
        """Compute q|k|v with ``fused`` (outputs side by side, bit-identical to the three parts'), or
        with the three projections again (None). Kept outside the module tree: the parts stay the
        serialized weights (a fused module shares or repacks them), so ``state_dict``,
        ``named_modules`` and :attr:`Decoder.weight_bytes` do not change."""
        _check_fused(self, fused)
        object.__setattr__(self, "fused_qkv", fused)  # nn.Module.__setattr__ would register a child

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        start: int,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """``x [T, hidden]`` → ``[T, hidden]``; writes this layer's keys/values at ``start``.
        ``mask`` None means causal (no mask tensor is built or read on the decode path).

        GQA without copying the cache: the query heads sharing one KV head are stacked as extra rows
        (``[kv_heads, group*T, head_dim]``), so one batched matmul per KV head covers the group.
        """
        seq = x.shape[0]
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        group = heads // kv_heads
        fused = self.fused_qkv
        if fused is not None:
            qkv = fused(x)
            qk, v = qkv[:, : (heads + kv_heads) * head_dim], qkv[:, (heads + kv_heads) * head_dim :]
        else:
            qk, v = torch.cat([self.q_proj(x), self.k_proj(x)], dim=-1), self.v_proj(x)
        # q and k heads side by side: one RoPE application for both (elementwise, so identical)
        qk = apply_rope(qk.reshape(seq, heads + kv_heads, head_dim).transpose(0, 1), cos, sin)
        q, k = qk[:heads], qk[heads:]
        v = v.reshape(seq, kv_heads, head_dim).transpose(0, 1)
        cache.write(self.layer_index, start, k, v)

        # start as a tensor of slots (static-cache steps): attend over every slot, the mask decides
        end = cache.k.shape[2] if isinstance(start, torch.Tensor) else start + seq
        keys = cache.k[self.layer_index, :, :end]  # [kv_heads, S, D]
        values = cache.v[self.layer_index, :, :end]
        if self.row_wise_attention and seq <= ROW_WISE_MAX_TOKENS:
            return self.o_proj(self._row_wise(q, keys, values, start, mask))
        q = q.reshape(kv_heads, group * seq, head_dim)
        scores = torch.matmul(q, keys.transpose(1, 2)).float() * head_dim**-0.5
        if mask is not None or seq > 1:
            if mask is None:
                mask = causal_mask(seq, start, x.device)
            scores = scores.view(kv_heads, group, seq, end).masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(values.dtype).view(kv_heads, group * seq, end)
        out = torch.matmul(probs, values)  # [kv_heads, group*T, D]
        out = out.view(heads, seq, head_dim).transpose(0, 1).reshape(seq, -1)
        return self.o_proj(out)

    def _row_wise(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """One query token at a time against exactly its visible keys: row i of a chunk runs the
        same ops on the same shapes as the same token decoded alone (M = group rows, K = its prefix)."""
        seq = q.shape[1]
        group = self.num_heads // self.num_kv_heads
        visible_rows = None if mask is None else mask[:, : start + seq]
        # which rows see exactly their causal prefix (a tree's first-child chain does): one compare and
        # one transfer for all rows, not two reductions and a sync per row per layer
        causal_rows = [True] * seq if visible_rows is None else \
            (visible_rows == causal_mask(seq, start, visible_rows.device)).all(-1).tolist()
        rows = []
        for i in range(seq):
            causal = causal_rows[i]
            visible = None if visible_rows is None else visible_rows[i]
            length = start + i + 1 if causal else start + seq
            qi = q[:, i].reshape(self.num_kv_heads, group, self.head_dim)
            scores = torch.matmul(qi, keys[:, :length].transpose(1, 2)).float() * self.head_dim**-0.5
            if not causal:  # tree attention: arbitrary visibility, still one row at a time
                scores = scores.masked_fill(~visible[:length], float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(values.dtype)
            rows.append(torch.matmul(probs, values[:, :length]).reshape(1, -1))
        return rows[0] if seq == 1 else torch.cat(rows, dim=0)


def causal_mask(seq: int, start: int, device: torch.device) -> torch.Tensor:
    """``[T, start+T]``: new token i (at slot start+i) sees slots 0 .. start+i."""
    return torch.ones(seq, start + seq, dtype=torch.bool, device=device).tril(diagonal=start)


class MLP(nn.Module):
    #: the projections that read the same input, in the order a fused module lays out their outputs
    FUSABLE_PROJECTIONS = ("gate_proj", "up_proj")

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        #: gate|up as one module (one kernel call), set by :meth:`set_fused_projections`; None: two calls
        self.fused_gate_up: nn.Module | None = None

    def set_fused_projections(self, fused: nn.Module | None) -> None:
        """Compute gate|up with ``fused``, or with the two projections again (None): as
        :meth:`Attention.set_fused_projections`."""
        _check_fused(self, fused)
        object.__setattr__(self, "fused_gate_up", fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.fused_gate_up
        if fused is not None:
            gate, up = fused(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_index)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache, start, mask):  # noqa: ANN001 - same types as Attention
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Body(nn.Module):
    """Holds the HF-named submodules (``model.embed_tokens``, ``model.layers``, ``model.norm``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        # nn.Embedding's own init runs normal_, and any arithmetic on the meta device (every cached
        # model's skeleton) goes through Python meta functions that import torch._dynamo: ~1 s of
        # every start, for values load_state_dict replaces
        if not weight.is_meta:
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class RaggedInput:
    """One request's part of :meth:`Decoder.forward_ragged`: ``input_ids [T]`` at ``positions [T]``
    appended to its own ``cache``; logits for the last ``num_logits`` rows (None: all)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    cache: KVCache
    num_logits: int | None = None
    attn_mask: torch.Tensor | None = None


class Decoder(nn.Module):
    """Llama-family causal LM with an external static KV cache."""

    def __init__(self, cfg: ModelConfig, max_rope_positions: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        #: "int8", "int4" once specdec/kernels/convert.py has converted the linears; None: float
        self.quantization: str | None = None
        #: runs the decoder layers instead of their modules' forwards (the quantized CPU paths' C++
        #: glue, specdec/kernels/layers.py), set by :meth:`set_layer_runner`; None: :meth:`_run_layers`
        self.layer_runner: Callable[..., torch.Tensor] | None = None
        #: the same layers over several requests' rows in one pass (:meth:`forward_ragged`); None: one by one
        self.ragged_layer_runner: Callable[..., torch.Tensor] | None = None
        #: LM heads cut to some of their rows, by row count or ids (:meth:`head_rows`)
        self._head_rows: dict[object, Callable[[torch.Tensor], torch.Tensor]] = {}
        self.model = _Body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        positions = max_rope_positions or cfg.max_position_embeddings
        if self.lm_head.weight.is_meta:  # a skeleton for cached weights: no arithmetic on meta (see _Body)
            cos = sin = torch.empty(positions, cfg.head_dim)
        else:
            cos, sin = rope_tables(cfg.head_dim, positions, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def new_cache(self, max_seq_len: int, dtype: torch.dtype | None = None) -> KVCache:
        """A cache for one sequence of at most ``max_seq_len`` positions, in the weights' dtype."""
        cfg = self.config
        return KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max_seq_len, dtype or self.float_dtype, self.device)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        attn_mask: torch.Tensor | None = None,
        layers: Sequence[int] | None = None,
        num_logits: int | None = None,
        return_hidden: bool = False,
        vocab_limit: int | None = None,
        static_cache: bool = False,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run ``T`` new tokens appended to the cache; return float32 logits ``[T or num_logits, vocab]``.

        ``positions [T]`` are the RoPE positions (not necessarily contiguous: tree nodes share depths).
        ``attn_mask [T, cache.seq_len + T]`` (True = may attend) overrides the default causal mask.
        ``layers`` runs only those decoder layers; the others pass the residual through.
        ``num_logits`` computes the LM head for the last ``num_logits`` positions only (prefill needs 1).
        ``vocab_limit`` computes logits for token ids ``0 .. vocab_limit-1`` only (a drafter's reduced
        vocabulary: see :meth:`head_rows`).
        ``static_cache`` (CUDA-graph capture, backends/cuda_graphs.py): keys/values go to cache slots
        ``slots [T]`` (default: ``positions``, a chain's) and every query attends over the whole cache
        under ``attn_mask [T, capacity]`` (default: computed on the device from the slots: causal), so
        no Python integer of this step is baked into the recorded kernels; the caller moves
        ``cache.seq_len``. A tree's nodes share positions, so a tree step passes its slots and mask.
        """
        seq = input_ids.shape[-1]
        input_ids = input_ids.reshape(seq)
        if static_cache:
            start: int | torch.Tensor = positions if slots is None else slots
            if attn_mask is None:
                attn_mask = torch.arange(cache.k.shape[2], device=positions.device) <= start[:, None]
        else:
            start = cache.reserve(seq)
        cos = self.rope_cos[positions].to(self.rope_dtype)
        sin = self.rope_sin[positions].to(self.rope_dtype)

        x = self.model.embed_tokens(input_ids)
        run = range(self.config.num_layers) if layers is None else layers
        runner = self.layer_runner or Decoder._run_layers
        for piece, stop in layer_pieces(run, cache.feature_layers):  # one piece unless a feature drafter asked
            x = runner(self, x, cos, sin, cache, start, attn_mask, piece) if piece else x
            if stop is not None:
                cache.write_features(start, x, stop)  # (static: at the slots tensor)
        if not static_cache:
            cache.advance(seq)

        hidden = self.model.norm(x if num_logits is None else x[-num_logits:])
        head = self.lm_head if vocab_limit is None or vocab_limit >= self.config.vocab_size else self.head_rows(vocab_limit)
        logits = head(hidden).float()
        return (logits, hidden) if return_hidden else logits

    def set_layer_runner(self, runner: Callable[..., torch.Tensor] | None,
                         ragged: Callable[..., torch.Tensor] | None = None) -> None:
        """Run the decoder layers through ``runner`` (same signature and results as
        :meth:`_run_layers`, which a runner is checked against in the tests), or through the modules'
        own forwards again (None). A runner may capture the layers' modules when it is made, so make
        it after the last change to them (conversion, :meth:`Attention.set_fused_projections`).
        ``ragged``: the same layers over several requests' rows at once (:meth:`forward_ragged`)."""
        self.layer_runner = runner
        self.ragged_layer_runner = ragged

    @torch.inference_mode()
    def forward_ragged(self, requests: Sequence[RaggedInput], vocab_limit: int | None = None) -> list[torch.Tensor]:
        """Several requests' new tokens — a prefill chunk, one decode token, a draft to verify, each
        with its own positions and cache — in one forward; returns each request's float32 logits
        ``[T_i or num_logits_i, vocab]``, **bit-identical** to ``forward`` on that request alone
        (tests/test_ragged.py checks with ``torch.equal``), so greedy output under load is output alone.

        The weights are read once for all rows: on a memory-bound CPU a step of 8 requests costs a
        fraction of 8 steps. Only a runner that is row by row (the quantized CPU paths' C++ layers)
        batches; elsewhere (float weights, whose GEMMs may block rows differently with the row count)
        the requests run one after another — the same results, no batching gain. ``vocab_limit``: as
        :meth:`forward`'s, for every request (a draft model's reduced vocabulary)."""
        if self.ragged_layer_runner is None or len(requests) == 1:
            return [self.forward(r.input_ids, r.positions, r.cache, r.attn_mask, num_logits=r.num_logits,
                                 vocab_limit=vocab_limit) for r in requests]
        segments, rows, picked, first = [], [], [], 0
        for r in requests:
            seq = r.input_ids.shape[-1]
            cos = self.rope_cos[r.positions].to(self.rope_dtype)
            sin = self.rope_sin[r.positions].to(self.rope_dtype)
            segments.append((first, first + seq, cos, sin, r.cache, r.cache.reserve(seq), r.attn_mask))
            rows.append(r.input_ids.reshape(seq))
            keep = seq if r.num_logits is None else r.num_logits
            picked.append(torch.arange(first + seq - keep, first + seq))
            first += seq
        x = self.model.embed_tokens(torch.cat(rows))
        stops = sorted({layer for r in requests for layer in r.cache.feature_layers})
        for piece, stop in layer_pieces(range(self.config.num_layers), stops):
            x = self.ragged_layer_runner(x, segments, piece) if piece else x
            if stop is not None:
                for r, (first, end, *_, start, _mask) in zip(requests, segments):
                    r.cache.write_features(start, x[first:end], stop)
        for r, (first, end, *_) in zip(requests, segments):
            r.cache.advance(end - first)
        index = torch.cat(picked)
        head = self.lm_head if vocab_limit is None or vocab_limit >= self.config.vocab_size else self.head_rows(vocab_limit)
        logits = head(self.model.norm(x[index])).float()
        return list(logits.split([len(p) for p in picked]))

    def _run_layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, start: int,
                    mask: torch.Tensor | None, run: Sequence[int]) -> torch.Tensor:
        for index in run:
            x = self.model.layers[index](x, cos, sin, cache, start, mask)
        return x

    def share_ends(self, source: "Decoder") -> None:
        """Use ``source``'s embedding table and LM head (and its cuts of the head, made once) instead
        of this decoder's own: a twin that runs only the layers in another execution mode
        (TorchBackend.use_for_prompts) needs no second copy of either."""
        self.model.embed_tokens = source.model.embed_tokens
        self.lm_head = source.lm_head
        self._head_rows = source._head_rows

    def head_rows(self, rows: "int | torch.Tensor") -> nn.Module:
        """The LM head restricted to its first ``rows`` outputs, or to the outputs ``rows [N]`` (a
        tensor of token ids, in that order), built once per cut.

        BPE vocabularies number tokens by merge rank, so low ids are the frequent ones (FR-Spec,
        Zhao et al. 2025): a draft scoring only them skips most of its LM head — about a quarter of a
        0.5B model's weights at 152k tokens. A trained head may instead score the ids most frequent
        in its training data (:mod:`specdec.train.vocab`). A float head's first rows are a view of
        the same rows, any other cut a copy; a quantized head (a kernel layer) makes its own through
        its ``first_rows(rows)`` / ``select_rows(ids)`` — a view for the int4 mode's first rows, a
        prepacked copy for int8 (fbgemm reads packed weights)."""
        key: object = rows if isinstance(rows, int) else ("ids", rows.numel(), hash(rows.cpu().numpy().tobytes()))
        cache = self._head_rows
        if key not in cache:
            head = self.lm_head
            if isinstance(head, nn.Linear):  # float weights; every quantized head cuts itself
                cache[key] = _float_rows(head, slice(0, rows) if isinstance(rows, int) else rows.to(self.device))
            else:
                cache[key] = head.first_rows(rows) if isinstance(rows, int) else head.select_rows(rows)
            if self.device.type == "cpu" and isinstance(cache[key], nn.Module):  # a quantized head's copied
                move_to_huge_pages(cache[key])  # cut is streamed like the head: onto huge pages too
        return cache[key]

    @property
    def float_dtype(self) -> torch.dtype:
        """The dtype activations and the KV cache are in: the final norm's (float in every mode; the
        embedding may be a quantized table, specdec/kernels/embedding.py)."""
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    @property
    def rope_dtype(self) -> torch.dtype:
        return self.float_dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights read per decode step: everything but the embedding table, of which a
        step reads one row — unless the float LM head *is* the embedding (tied), which reads it all."""
        head = getattr(self.lm_head, "weight", None)
        embedding = {t.data_ptr() for t in [*self.model.embed_tokens.parameters(), *self.model.embed_tokens.buffers()]}
        if head is not None and head.data_ptr() in embedding:
            embedding.discard(head.data_ptr())
        total = 0
        seen: set[int] = set(embedding)
        for tensor in [*self.parameters(), *self.buffers()]:
            if tensor.data_ptr() in seen or tensor is self.rope_cos or tensor is self.rope_sin:
                continue
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
        return total


def layer_pieces(run: Sequence[int], stops: Sequence[int]) -> list[tuple[list[int], int | None]]:
    """``run``'s layers cut where the residual stream entering each layer of ``stops`` (ascending;
    ``num_layers``: the final hidden state) is to be kept: ``(layers, stop)`` pieces, each ending
    at its stop, then the rest with stop None. A piece may be empty. Runners add a layer's output
    to the stream before they return, so running pieces one after another gives the same bits as
    one run (tests/test_feature_layers.py)."""
    layers = list(run)
    pieces: list[tuple[list[int], int | None]] = []
    done = 0
    for stop in stops:
        end = next((i for i in range(done, len(layers)) if layers[i] >= stop), len(layers))
        pieces.append((layers[done:end], stop))
        done = end
    pieces.append((layers[done:], None))
    return pieces


def _float_rows(head: nn.Linear, rows: "slice | torch.Tensor") -> Callable[[torch.Tensor], torch.Tensor]:
    """A float LM head's outputs ``rows`` (a slice: a view; ids: a copy) as a function of the normed hidden state."""
    weight, bias = head.weight[rows], None if head.bias is None else head.bias[rows]
    return lambda x: F.linear(x, weight, bias)
