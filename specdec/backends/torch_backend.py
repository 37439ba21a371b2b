"""Our own PyTorch decoder as a :class:`~specdec.backends.base.Backend` (CPU and CUDA)."""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.backends.cuda_graphs import CudaGraphRunner
from specdec.config import env_switch
from specdec.huge_pages import move_to_huge_pages
from specdec.models.kv_cache import KVCache
from specdec.models.transformer import Decoder, RaggedInput
from specdec.prefix_cache import PrefixCache
from specdec.tree import TreeLayout

#: one request's part of :meth:`TorchBackend.forward_batch`: (state, tokens, num_logits, tree)
BatchCall = tuple[KVCache, Sequence[int], "int | None", "TreeLayout | None"]


def cuda_graphs_enabled() -> bool:
    """CUDA graphs are on by default; ``SPECDEC_CUDA_GRAPHS=0`` runs every step eagerly."""
    return env_switch("SPECDEC_CUDA_GRAPHS")


def row_tables(decoder: Decoder) -> list[torch.Tensor]:
    """What a step reads one row of per token — the token table (unless the LM head shares it) and the
    RoPE tables — and so left on 4 KiB pages: no stream for huge pages to speed up, and 0.27 GB of the
    1.5B target's 1.94 (the move's cost is per byte: seconds on a VM whose host reclaims idle memory)."""
    embedding = decoder.model.embed_tokens
    head = {id(tensor) for tensor in (*decoder.lm_head.parameters(), *decoder.lm_head.buffers())}
    own = [tensor for tensor in (*embedding.parameters(), *embedding.buffers()) if id(tensor) not in head]
    return [*own, decoder.rope_cos, decoder.rope_sin]


class TorchBackend:
    """Wraps a :class:`Decoder`; each request gets its own :class:`KVCache` from :meth:`new_state`.
    On CUDA (float weights) small chunks replay recorded CUDA graphs (backends/cuda_graphs.py)."""

    def __init__(self, decoder: Decoder, cuda_graphs: bool | None = None, huge_pages: bool = True) -> None:
        """``huge_pages``: move a CPU model's weights onto 2 MiB pages (specdec/huge_pages.py) — what a
        decode step's weight stream wants — except the tables a step reads a row of (:func:`row_tables`);
        a twin that runs only prompt passes (compute-bound GEMMs, see :meth:`use_for_prompts`) is
        loaded without, sparing the load the move."""
        #: bytes of the model moved onto 2 MiB pages at load; 0: none
        moved = huge_pages and decoder.device.type == "cpu"
        self.huge_page_bytes = move_to_huge_pages(decoder, skip=row_tables(decoder)) if moved else 0
        self.decoder = decoder
        self.config = decoder.config
        self.device = decoder.device
        self.dtype_name = decoder.quantization or str(decoder.float_dtype).removeprefix("torch.")
        #: the execution mode it was loaded in (int8, int4, int4-all: what step-cost curves are keyed
        #: by; dtype_name says int4 for both 4-bit modes), else dtype_name
        self.mode = self.dtype_name
        #: seconds of a forward of T tokens (T → s) measured on this machine for this model's shape
        #: and execution mode (specdec.step_costs), when known: the γ cost model starts from it
        self.step_seconds: dict[int, float] | None = None
        #: real ÷ probe seconds at a few chunk sizes, timed after loading (specdec.step_calibration)
        self.step_ratios: dict[int, float] = {}
        #: runs this model's prompt passes (engine prefill, a draft model's catch-up): see use_for_prompts
        self.prompt_backend: TorchBackend = self
        #: earlier prompts' keys/values (specdec/prefix_cache.py), where enabled
        self.prefix_cache: PrefixCache | None = None
        self._weight_bytes: int | None = None  # see weight_bytes
        use_graphs = cuda_graphs_enabled() if cuda_graphs is None else cuda_graphs
        self.graphs: CudaGraphRunner | None = None
        if use_graphs and self.device.type == "cuda" and decoder.layer_runner is None and decoder.quantization is None:
            self.graphs = CudaGraphRunner(decoder)

    def use_for_prompts(self, other: "TorchBackend") -> None:
        """Run this model's prompt passes through ``other``: the same weights in another CPU execution
        mode whose many-row forwards are cheaper (fbgemm's int8 prefills a prompt ~1.8× faster than
        our int4 kernel on an AVX-512 VNNI EPYC, while int4 decodes ~1.7× faster). Its forwards write
        this backend's caches (same shapes); it shares this one's embedding table and LM head (a
        prompt pass scores one row: only the layers are worth a second copy — and a draft's cut of an
        int8 head for its reduced vocabulary cost a second's repacking on first use). Exact: whether a
        row runs here or there depends only on whether it is a prompt row, never on what it is
        batched with, so plain and speculative decoding — alone or under load — read the same cache."""
        if other.config != self.config or other.device != self.device:
            raise ValueError("a prompt backend must run the same model on the same device")
        if other.decoder.float_dtype != self.decoder.float_dtype:
            raise ValueError("a prompt backend must write caches of the same dtype")
        other.decoder.share_ends(self.decoder)
        other._weight_bytes = None  # its ends are this one's now: count again when asked
        self.prompt_backend = other

    def new_state(self, max_seq_len: int) -> KVCache:
        if self.graphs is not None:
            return self.graphs.new_cache(max_seq_len)
        return self.decoder.new_cache(max_seq_len)

    def forward(
        self,
        state: KVCache,
        tokens: Sequence[int] | torch.Tensor,
        num_logits: int | None = None,
        layers: Sequence[int] | None = None,
        return_hidden: bool = False,
        vocab_limit: int | None = None,
        tree: TreeLayout | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``tree``: the tokens end this tree region of the cache (tree attention, specdec/tree.py)."""
        ids, positions, mask = self._inputs(state, tokens, tree)
        if self.graphs is not None and self.graphs.can_run(state, ids.numel(), layers, return_hidden, vocab_limit):
            return self.graphs.forward(state, ids, positions, mask, num_logits)
        return self.decoder(ids, positions, state, mask, num_logits=num_logits, layers=layers,
                            return_hidden=return_hidden, vocab_limit=vocab_limit)

    def forward_batch(self, calls: Sequence[BatchCall], vocab_limit: int | None = None) -> list[torch.Tensor]:
        """One ``Decoder.forward_ragged`` over the calls ``(state, tokens, num_logits, tree)``
        (bit-identical per call to :meth:`forward`; it runs them one by one where its layers cannot
        batch); CUDA graphs replay one call each."""
        if self.graphs is not None:
            return [self.forward(state, tokens, num_logits=num_logits, tree=tree, vocab_limit=vocab_limit)
                    for state, tokens, num_logits, tree in calls]
        inputs = [(state, num_logits, *self._inputs(state, tokens, tree)) for state, tokens, num_logits, tree in calls]
        return self.decoder.forward_ragged([RaggedInput(ids, positions, state, num_logits, mask)
                                            for state, num_logits, ids, positions, mask in inputs], vocab_limit)

    def _inputs(self, state: KVCache, tokens: Sequence[int] | torch.Tensor,
                tree: TreeLayout | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``tokens`` as ids ``[T]``, the positions they take after ``state``'s ``seq_len`` (a
        tree's: by depth), and the tree's attention mask (None: causal)."""
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device).reshape(-1)
        if tree is None:
            return ids, torch.arange(state.seq_len, state.seq_len + ids.numel(), device=self.device), None
        if tree.base + len(tree.parents) != state.seq_len + ids.numel():
            raise ValueError(f"the tree region ends at slot {tree.base + len(tree.parents)}, "
                             f"but this forward ends at {state.seq_len + ids.numel()}")
        return ids, tree.positions(ids.numel(), self.device), tree.mask(ids.numel(), self.device)

    @property
    def weight_bytes(self) -> int:
        """The decoder's (:attr:`Decoder.weight_bytes`), counted once: every request's stats ask, and
        walking the modules took 4–5 ms a request on the server's model thread."""
        if self._weight_bytes is None:
            self._weight_bytes = self.decoder.weight_bytes
        return self._weight_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of every layer, in the cache's dtype (the weights' float dtype: float32 on the CPU)."""
        cfg = self.config
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * torch.finfo(self.decoder.float_dtype).bits // 8

    def weight_passes(self, calls: int) -> int:
        """Once for a batch only where :meth:`forward_batch` batches: the quantized CPU layers' ragged runner, no
        CUDA graphs (which replay one call each); float weights run the calls one after another."""
        batches = self.graphs is None and self.decoder.ragged_layer_runner is not None
        return 1 if batches or calls <= 1 else calls

    def synchronize(self) -> None:
        """Wait for queued device work so wall-clock timings mean something on CUDA."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
