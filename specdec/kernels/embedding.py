"""An embedding table kept in its GGUF block format; the rows a forward needs are dequantized on lookup.

Why: the quantized modes run every matrix in a low-bit kernel, but the token embedding was kept as a
float32 table — 0.93 GB of the 1.5B target's ~2.5 GB and 0.55 GB of the 0.5B draft's ~0.85 GB, for
a table a decode step reads one row of. The GGUF file already stores it in 4–5 bits (Q4_K, Q5_0);
keeping those bytes and dequantizing looked-up rows with the same ``gguf`` routine that produced the
float table gives **bit-identical** rows (dequantization is per block, and blocks never cross rows),
so outputs do not change — :func:`block_embedding_or_none` checks the whole table once at
conversion and keeps the float table where they would differ.

Speed: a ``gguf.quants.dequantize`` call costs 0.10–0.15 ms however few rows it gets (measured here),
~1 % of a 12 ms draft step, and made speculative decoding measurably slower. So the first
:data:`HOT_ROWS` rows are also kept as float32: BPE vocabularies number tokens by merge rank, so low
ids are the frequent ones (92 % of HumanEval prompt tokens are below 16384 for Qwen2.5), and a
forward whose ids are all hot is one ``F.embedding``. Memory: 0.93 → 0.23 GB for the 1.5B target's
table, 0.55 → 0.15 GB for the 0.5B draft's.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

#: rows also held as float32 (the frequent tokens of a merge-ranked BPE vocabulary)
HOT_ROWS = 16384


class BlockEmbedding(nn.Module):
    """``ids [T] → float32 [T, hidden]`` from ``blocks [vocab, row_bytes]`` (uint8, a GGUF tensor's
    rows as stored) and its GGUF quantization type."""

    def __init__(self, blocks: torch.Tensor, quant_type: torch.Tensor | int, hidden_size: int,
                 hot_rows: int = HOT_ROWS) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.register_buffer("blocks", blocks.contiguous(), persistent=True)
        self.register_buffer("quant_type", torch.tensor([int(quant_type)], dtype=torch.int64), persistent=True)
        import gguf

        self._gguf_type = gguf.GGMLQuantizationType(int(self.quant_type.item()))
        hot = max(1, min(hot_rows, blocks.shape[0]))
        self.register_buffer("hot", torch.from_numpy(np.ascontiguousarray(self.rows(torch.arange(hot)))), persistent=False)

    def rows(self, ids: np.ndarray | torch.Tensor) -> np.ndarray:
        """The float32 rows ``[len(ids), hidden]`` of these token ids."""
        import gguf

        picked = self.blocks.index_select(0, torch.as_tensor(ids).reshape(-1)).numpy()
        return gguf.quants.dequantize(picked, self._gguf_type).reshape(-1, self.hidden_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1)
        hot = self.hot.shape[0]
        out = F.embedding(ids.clamp(max=hot - 1), self.hot)
        cold = ids >= hot
        if bool(cold.any()):  # index_select raises on an id past the vocabulary (the engine checks first)
            out[cold] = torch.from_numpy(np.ascontiguousarray(self.rows(ids[cold])))
        return out.reshape(*input_ids.shape, self.hidden_size)

    def dequantized(self) -> torch.Tensor:
        """The whole table in float32 (tests, and the one check at conversion)."""
        return torch.from_numpy(np.ascontiguousarray(self.rows(torch.arange(self.blocks.shape[0]))))


def block_embedding_or_none(raw_rows: np.ndarray, quant_type: int, float_table: torch.Tensor) -> BlockEmbedding | None:
    """A :class:`BlockEmbedding` of a GGUF token table's raw rows ``[vocab, row_bytes]``, if its rows
    equal ``float_table [vocab, hidden]`` (the loader's dequantized copy) bit for bit; else None
    (a float or an unrecognised type, or a loader that transformed the table)."""
    import gguf

    try:
        kind = gguf.GGMLQuantizationType(int(quant_type))
    except ValueError:
        return None
    if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16):
        return None  # nothing to gain over float32 that is certainly exact (F16 would be; it is rare)
    if raw_rows.ndim != 2 or raw_rows.shape[0] != float_table.shape[0] or float_table.dtype != torch.float32:
        return None
    embedding = BlockEmbedding(torch.from_numpy(np.array(raw_rows, dtype=np.uint8)), int(kind), float_table.shape[1])
    try:
        same = torch.equal(embedding.dequantized(), float_table)
    except (NotImplementedError, ValueError):  # a type gguf cannot dequantize, or rows of another width
        return None
    return embedding if same else None
