"""Moving a CPU model onto transparent huge pages (specdec/huge_pages.py) changes where its tensors live
and nothing else: every value, every view relation (fused projections and their parts, a head and its
cuts), every tensor a module keeps outside its parameters and buffers, and every output bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import specdec
from specdec import huge_pages
from specdec.huge_pages import huge_pages_supported, in_arena, move_to_huge_pages

needs_thp = pytest.mark.skipif(not huge_pages_supported(), reason="no transparent huge pages on this machine")


class Holder(nn.Module):
    """A parameter, a buffer and a view of it, a plain tensor attribute, a module outside the tree that
    shares the tree's memory (as fused projections do) and a dict of modules (as a head's cuts are)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1024, 1024), requires_grad=False)  # 4 MiB: whole huge pages
        self.register_buffer("codes", torch.randint(0, 255, (600, 512), dtype=torch.uint8))
        self.part = nn.Module()
        self.part.register_buffer("rows", self.codes[100:400])
        self.copy = torch.randn(70_000)
        fused = nn.Module()
        fused.register_buffer("whole", torch.arange(50_000, dtype=torch.int32))
        object.__setattr__(self, "fused", fused)
        self.part.register_buffer("first", fused.whole[:20_000])
        self.cuts = {"a": nn.Linear(256, 256), "small": nn.Linear(64, 64)}


def tensors_of(holder: Holder) -> dict[str, torch.Tensor]:
    return {"weight": holder.weight, "codes": holder.codes, "rows": holder.part.rows, "copy": holder.copy,
            "whole": holder.fused.whole, "first": holder.part.first, "cut": holder.cuts["a"].weight}


def thp_eligible(address: int) -> bool:
    """Whether the kernel may back the mapping holding ``address`` with huge pages (/proc/self/smaps)."""
    current = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:
            start, end = (int(part, 16) for part in fields[0].split("-"))
            current = start <= address < end
        elif current and fields[0] == "THPeligible:":
            return fields[1] == "1"
    raise AssertionError(f"no mapping holds {address:#x}")


@needs_thp
def test_moving_keeps_values_views_and_every_held_tensor():
    holder = Holder()
    before = {name: tensor.clone() for name, tensor in tensors_of(holder).items()}
    moved = move_to_huge_pages(holder, min_bytes=0)
    tensors = tensors_of(holder)
    assert moved >= sum(t.untyped_storage().nbytes() for t in (before["weight"], before["codes"], before["copy"]))
    for name, tensor in tensors.items():
        assert in_arena(tensor), name
        assert torch.equal(tensor, before[name]), name
    # views stay views of the same memory, at the same offsets
    assert tensors["rows"].data_ptr() == tensors["codes"].data_ptr() + 100 * 512
    assert tensors["first"].data_ptr() == tensors["whole"].data_ptr()
    tensors["codes"][150, 0] = 7
    assert tensors["rows"][50, 0] == 7
    assert tensors["weight"].data_ptr() % huge_pages.ALIGN == 0
    assert thp_eligible(tensors["weight"].data_ptr())  # the arena (> 2 MiB) was advised
    assert move_to_huge_pages(holder, min_bytes=0) == 0  # already there


@needs_thp
def test_small_tensors_stay_and_the_switch_turns_it_off(monkeypatch):
    holder = Holder()
    for off in ("off", "False", " no "):  # as every on/off switch reads (config.env_switch)
        monkeypatch.setenv("SPECDEC_HUGE_PAGES", off)
        assert not huge_pages_supported(), off
    monkeypatch.setenv("SPECDEC_HUGE_PAGES", "0")
    assert not huge_pages_supported()
    assert move_to_huge_pages(holder, min_bytes=0) == 0
    assert not in_arena(holder.weight)
    monkeypatch.setenv("SPECDEC_HUGE_PAGES", "1")
    move_to_huge_pages(holder)  # default threshold: 64 KiB
    assert in_arena(holder.codes) and in_arena(holder.cuts["a"].weight)  # 300 KB, 256 KB
    assert not in_arena(holder.cuts["small"].weight)  # 16 KB


@needs_thp
def test_an_arena_is_unmapped_with_its_last_tensor():
    holder = Holder()
    move_to_huge_pages(holder, min_bytes=0)
    address = holder.weight.untyped_storage().data_ptr()
    assert address in huge_pages._ARENAS
    del holder
    import gc

    gc.collect()
    assert address not in huge_pages._ARENAS


@needs_thp
@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_a_moved_model_gives_the_same_logits(monkeypatch, tiny_dirs, int4_kernel, mode):
    """Through the C++ layer loop, which holds the fused projections' tensors (and on AMX machines the 4-bit
    layers' copies): it must read the moved memory, and the same bits come out."""
    monkeypatch.setenv("SPECDEC_HUGE_PAGES", "0")
    backend = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=mode).backend
    monkeypatch.setenv("SPECDEC_HUGE_PAGES", "1")
    tokens = list(range(5, 40))

    def logits() -> torch.Tensor:
        state = backend.new_state(64)
        prompt = backend.forward(state, tokens[:30])
        return torch.cat([prompt, backend.forward(state, tokens[30:31]), backend.forward(state, tokens[31:])])

    before = logits()
    assert move_to_huge_pages(backend.decoder, min_bytes=0) > 0
    assert all(in_arena(t) for t in huge_pages._cpu_tensors(backend.decoder))
    layer = backend.decoder.model.layers[0]
    fused = [layer.self_attn.fused_qkv, layer.mlp.fused_gate_up]  # outside the module tree: what the loop calls
    assert all(module is not None for module in fused)
    held = [t for module in fused for t in (*module.buffers(), *module.parameters(), getattr(module, "_amx_copy", None))
            if t is not None]
    assert held and all(in_arena(t) for t in held)
    assert torch.equal(logits(), before)


@needs_thp
def test_inference_tensors_and_trainable_parameters_move():
    """Weights made under torch.inference_mode can be changed in place only there; a trainable parameter
    keeps training (DistillSpec trains a loaded draft's layers) on its new memory."""
    with torch.inference_mode():
        frozen = nn.Linear(512, 512)
        expected = frozen(torch.ones(1, 512))
    assert move_to_huge_pages(frozen) > 0 and in_arena(frozen.weight)
    with torch.inference_mode():
        assert torch.equal(frozen(torch.ones(1, 512)), expected)
    trained = nn.Linear(512, 512)
    move_to_huge_pages(trained)
    assert trained.weight.requires_grad and in_arena(trained.weight)
    trained(torch.ones(1, 512)).sum().backward()
    before = trained.weight.detach().clone()
    torch.optim.SGD(trained.parameters(), lr=0.1).step()
    assert in_arena(trained.weight) and not torch.equal(trained.weight, before)


@needs_thp
def test_moving_inside_inference_mode_faults_pages_from_threads(monkeypatch):
    """A head cut made mid-request moves under inference_mode, so its arena is an inference tensor; the threads
    that fault it in must write it in that mode too (inference_mode is per thread)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with torch.inference_mode():
        layer = nn.Linear(2048, 1024)  # 8 MiB: four huge pages, two per thread
        expected = layer.weight.clone()
        assert move_to_huge_pages(layer) > 0
        assert in_arena(layer.weight) and torch.equal(layer.weight, expected)


@needs_thp
def test_loaded_models_move_but_prompt_twins_do_not(tiny_dirs, int4_kernel, monkeypatch):
    """A loaded CPU model's weights are moved (the float tiny model's head: 128 KB) but not the tables a step
    reads a row of (its token table, as large, and the RoPE tables); a twin that runs only prompt passes
    (compute-bound) is not moved, and the execution line says so."""
    from specdec.cli.common import pages_in_use

    float_model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu")
    decoder = float_model.backend.decoder
    assert float_model.backend.huge_page_bytes == 128 * 1024 and in_arena(decoder.lm_head.weight)
    assert not any(in_arena(t) for t in (decoder.model.embed_tokens.weight, decoder.rope_cos, decoder.rope_sin))
    assert pages_in_use(float_model, None) == ", weights on 2 MiB pages (0.0 GB)"
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)  # every tensor of the tiny model moves, wherever it is moved
    twin_model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int4",
                                    prompt_quantize="int8")
    main, twin = twin_model.backend, twin_model.backend.prompt_backend
    assert twin is not main and twin.huge_page_bytes == 0 and main.huge_page_bytes > 0
    assert all(in_arena(t) for t in huge_pages._cpu_tensors(main.decoder.model.layers[0]))
    assert not any(in_arena(t) for t in huge_pages._cpu_tensors(twin.decoder.model.layers[0]))


@needs_thp
def test_kv_caches_start_zero_on_huge_pages(monkeypatch):
    """A CPU KV cache of MIN_BYTES or more gets its own arena (zero without being written: a fresh mapping);
    a small one, or any with the switch off, is torch.zeros as before."""
    from specdec.models.kv_cache import KVCache

    big = KVCache(4, 2, 64, 1024)  # 2 MiB per tensor
    assert in_arena(big.k) and in_arena(big.v) and big.k.data_ptr() != big.v.data_ptr()
    assert big.k.shape == (4, 2, 1024, 64) and big.k.is_contiguous() and not big.k.any() and not big.v.any()
    big.k[3, 1, 1023] = 1.0
    assert big.k.sum() == 64
    assert not in_arena(KVCache(1, 1, 8, 16).k)
    monkeypatch.setenv("SPECDEC_HUGE_PAGES", "0")
    assert not in_arena(KVCache(4, 2, 64, 1024).k)


def test_row_tables_leave_a_shared_head_to_move():
    """The token table stays on 4 KiB pages unless the LM head is the same tensor (tied embeddings: streamed
    every step as the head); the RoPE tables always stay."""
    from specdec.backends.torch_backend import row_tables
    from specdec.models.config import ModelConfig
    from specdec.models.transformer import Decoder
    from tests.model_fixtures import TINY_QWEN2

    for tied in (False, True):
        decoder = Decoder(ModelConfig.from_hf_dict({**TINY_QWEN2, "tie_word_embeddings": tied}))
        ids = {id(t) for t in row_tables(decoder)}
        assert id(decoder.rope_cos) in ids and id(decoder.rope_sin) in ids
        assert (id(decoder.model.embed_tokens.weight) in ids) is not tied
