"""The quantized modes keep a GGUF's token table in its own blocks (kernels/embedding.py): same logits
bit for bit, a fraction of the memory, and nothing of the mapped cache file left resident."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdec.kernels.convert import quantize_decoder
from specdec.kernels.embedding import BlockEmbedding, block_embedding_or_none
from specdec.models.gguf_file import gguf_embedding_rows, open_gguf
from specdec.models.weights import load_decoder, load_int4_decoder, load_int8_decoder
from tests.gguf_fixtures import Q, write_tiny_gguf
from tests.model_fixtures import TINY_LLAMA, TINY_QWEN2, TINY_QWEN2_Q4, make_hf_model

IDS = torch.tensor([3, 511, 0, 77, 77, 200, 12, 5, 450, 9, 1])


def _gguf(tmp_path: Path, config: dict, embedding_type) -> Path:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, make_hf_model(config, seed=4), config, matrix_type=Q.Q8_0, embedding_type=embedding_type)
    return path


def _logits(decoder: torch.nn.Module) -> torch.Tensor:
    return decoder(IDS, torch.arange(len(IDS)), decoder.new_cache(16))


def _mapped(file: Path) -> bool:
    return str(file.resolve()) in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("config,embedding_type", [(TINY_QWEN2, Q.Q5_0), (TINY_QWEN2, Q.Q8_0), (TINY_LLAMA, Q.Q4_0)],
                         ids=["qwen2-Q5_0", "qwen2-Q8_0", "llama-tied-Q4_0"])
def test_int8_keeps_the_gguf_table_and_the_same_logits(tmp_path, config, embedding_type):
    path = _gguf(tmp_path, config, embedding_type)
    float_table = load_decoder(path).model.embed_tokens.weight.detach()
    reference = quantize_decoder(load_decoder(path))  # the int8 model with the float32 table
    converted = load_int8_decoder(path)  # first load: converts and caches
    cached = load_int8_decoder(path)  # second: from the cache file
    for model in (converted, cached):
        assert isinstance(model.model.embed_tokens, BlockEmbedding)
        assert torch.equal(model.model.embed_tokens.dequantized(), float_table)
        assert torch.equal(_logits(model), _logits(reference))
        assert model.weight_bytes == reference.weight_bytes  # a step still reads one row of it
    table = reference.model.embed_tokens.weight
    held = cached.model.embed_tokens.blocks
    assert held.nbytes < table.nbytes / 3  # 4–8.5 bits per weight instead of 32


def test_int4_keeps_the_gguf_table_and_the_same_logits(tmp_path):
    path = _gguf(tmp_path, TINY_QWEN2_Q4, Q.Q5_0)
    first, second = load_int4_decoder(path), load_int4_decoder(path)
    assert isinstance(second.model.embed_tokens, BlockEmbedding)
    assert torch.equal(second.model.embed_tokens.dequantized(), load_decoder(path).model.embed_tokens.weight)
    assert torch.equal(_logits(first), _logits(second))


def test_a_float_table_stays_float(tmp_path):
    path = _gguf(tmp_path, TINY_QWEN2, Q.F16)
    assert gguf_embedding_rows(open_gguf(path)) is None
    assert isinstance(load_int8_decoder(path).model.embed_tokens, torch.nn.Embedding)


def test_the_table_is_kept_only_where_every_row_is_bit_identical(tmp_path):
    path = _gguf(tmp_path, TINY_QWEN2, Q.Q5_0)
    rows, kind = gguf_embedding_rows(open_gguf(path))
    table = load_decoder(path).model.embed_tokens.weight.detach()
    assert block_embedding_or_none(rows, kind, table) is not None
    nudged = table.clone()
    nudged[300, 7] = torch.nextafter(nudged[300, 7], torch.tensor(1.0))  # one ulp in one row
    assert block_embedding_or_none(rows, kind, nudged) is None
    assert block_embedding_or_none(rows[:-1], kind, table) is None  # a table of another shape


@pytest.mark.parametrize("hot_rows", [1, 100, 512])
def test_lookup_rows_are_the_table_rows_in_any_order_and_shape(tmp_path, hot_rows):
    """Hot rows come from the float copy, the others are dequantized per call: either way the table's rows."""
    path = _gguf(tmp_path, TINY_QWEN2, Q.Q5_0)
    loaded = load_int8_decoder(path).model.embed_tokens
    embedding = BlockEmbedding(loaded.blocks, loaded.quant_type, TINY_QWEN2["hidden_size"], hot_rows=hot_rows)
    table = embedding.dequantized()
    for ids in (torch.tensor([[5, 5, 511], [0, 44, 3]]), torch.tensor([99, 100, 101]), torch.tensor([7])):
        out = embedding(ids)
        assert out.shape == (*ids.shape, TINY_QWEN2["hidden_size"]) and out.dtype == torch.float32
        assert torch.equal(out, table[ids])
    for bad in (512, -1):
        with pytest.raises(IndexError):
            embedding(torch.tensor([3, bad]))


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)")
def test_a_model_loaded_from_its_cache_holds_no_view_of_the_file(tmp_path):
    """Tensors read from the cache are views of a mapped file; one kept (a scale, a bias, a 0-d
    tensor) held the whole mapping, and its touched pages stayed resident beside the copies the
    kernels use (measured: +1.5 GB for the 1.5B int8 target)."""
    import gc

    path = _gguf(tmp_path, TINY_QWEN2_Q4, Q.Q5_0)
    load_int8_decoder(path)  # converts from a fresh dequantization; writes the float32 cache too
    converted = load_int4_decoder(path)  # converts from the float32 cache, a mapped file
    gc.collect()
    float_cache = next(tmp_path.glob("tiny.float32.v*.safetensors"))
    assert not _mapped(float_cache), "a converted model still holds views of the float32 cache"
    del converted
    for loader, fmt in ((load_int8_decoder, "int8"), (load_int4_decoder, "int4")):
        cache_file = next(tmp_path.glob(f"tiny.{fmt}.v*.safetensors"))
        model = loader(path)
        gc.collect()
        assert not _mapped(cache_file), f"{fmt}: the cache file is still mapped after loading"
        assert torch.isfinite(_logits(model)).all()
