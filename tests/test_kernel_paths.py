"""The linear kernels' instruction-set paths (AVX2, AVX-VNNI, AVX-512 VNNI): each path batch-invariant on its own
(a row's output bit-identical alone and inside a chunk), every path giving the same bits as every
other, and the path chosen at run time by what the CPU reports.

Paths this CPU lacks are skipped with the reason: a CPU without AVX-512 VNNI or AVX-VNNI runs only the
AVX2 path (a CPU with AVX-512 VNNI and AVX-VNNI, like Sapphire Rapids, tests all three).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from specdec.errors import SpecdecError
from specdec.kernels.build import kernel
from tests.model_fixtures import require_cpu_kernels

require_cpu_kernels()

from specdec.kernels.build import kernel_path, kernel_paths, use_kernel_path, use_q4_amx_rows
from specdec.kernels.q4 import Q4Linear, Q8Linear
from specdec.kernels.q6 import Q6K_BLOCK_BYTES, Q6Linear

ALL_PATHS = ("avx512-vnni", "avx-vnni", "avx2")


def cpu_flags() -> set[str]:
    from specdec.cpu import cpu_flags as flags

    return set(flags())


@pytest.fixture(params=ALL_PATHS)
def path(request):
    """Each kernel path in turn, skipped where this CPU cannot run it."""
    if request.param not in kernel_paths():
        pytest.skip(f"this CPU has no {request.param} (flags: {' '.join(sorted(cpu_flags()))})")
    with use_kernel_path(request.param):
        yield request.param


def random_q6k(rows: int, blocks: int, seed: int) -> np.ndarray:
    """Random Q6_K bytes: every code 0..63 and every int8 scale occur (the kernels' exactness edges)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, blocks, Q6K_BLOCK_BYTES), dtype=np.uint8)
    raw[..., 208:210] = rng.uniform(1e-4, 1e-3, size=(rows, blocks, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, blocks * Q6K_BLOCK_BYTES)


def make_layer(kind: str, width: int, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    if kind == "q6":
        return Q6Linear.from_q6k(random_q6k(40, width // 256, seed))
    weight = torch.randn(40, width, generator=gen) * 0.05
    return (Q4Linear if kind == "q4" else Q8Linear).from_float(weight, torch.randn(40, generator=gen))


def make_rows(rows: int, width: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))
    x[min(1, rows - 1)] *= 50  # an outlier row must not change its neighbours (per-token scales)
    return x


# 768: whole blocks; 896: a partial last block of 4 groups (the 0.5B draft's width); 320: 2 groups
LAYERS = [("q4", 768), ("q4", 896), ("q4", 320), ("q8", 768), ("q8", 896), ("q6", 768)]


def test_the_best_path_this_cpu_has_is_the_default():
    paths = kernel_paths()
    assert paths and set(paths) <= set(ALL_PATHS) and "avx2" in paths
    assert kernel_path() == paths[0]
    flags = cpu_flags()
    has_vnni = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags
    assert ("avx512-vnni" in paths) == has_vnni, f"flags {sorted(flags)} but paths {paths}"
    # (a compiler older than GCC 11 / clang 12 builds no AVX-VNNI code: linear_kernels_avxvnni.cpp)
    assert ("avx-vnni" in paths) == ("avx_vnni" in flags), f"flags {sorted(flags)} but paths {paths}"


def test_an_unknown_or_unsupported_path_is_refused_and_the_setting_restored():
    before = kernel_path()
    with pytest.raises(SpecdecError, match="does not run on this CPU"):
        with use_kernel_path("avx9000"):
            pass
    with pytest.raises(RuntimeError, match="unknown kernel path"):
        kernel().set_kernel_path("avx9000")
    with pytest.raises(KeyError):
        with use_kernel_path("avx2"):
            assert kernel_path() == "avx2"
            raise KeyError("inside")
    assert kernel_path() == before


@pytest.mark.parametrize("rows", [2, 4, 5, 8, 9, 17])  # one pass of ≤ 8 rows, tiles of 8, remainders
@pytest.mark.parametrize("kind,width", LAYERS)
def test_each_path_rows_bit_identical_alone_and_in_a_chunk(path, kind, width, rows):
    layer = make_layer(kind, width, seed=rows)
    x = make_rows(rows, width, seed=rows + 100)
    chunk = layer(x)
    for i in range(rows):
        assert torch.equal(chunk[i], layer(x[i : i + 1])[0]), f"{path}: row {i} of {rows}"


@pytest.mark.parametrize("kind,width", LAYERS)
def test_every_path_gives_the_same_bits(kind, width):
    paths = kernel_paths()
    if len(paths) < 2:
        pytest.skip(f"this CPU runs one kernel path ({paths[0]})")
    layer = make_layer(kind, width, seed=7)
    x = make_rows(11, width, seed=8)
    outputs = {}
    for name in paths:
        with use_kernel_path(name):
            outputs[name] = layer(x)
    for name in paths[1:]:
        assert torch.equal(outputs[name], outputs[paths[0]]), f"{name} differs from {paths[0]}"


def test_each_path_close_to_the_float_weights(path):
    """The exact-integer claim checked against float: a wrong lane order or scale would be far off."""
    for kind, width in LAYERS:
        layer = make_layer(kind, width, seed=3)
        x = make_rows(6, width, seed=4)
        weight = layer.dequantized() if kind != "q8" else layer.w8.float() * layer.w8_scales[:, None]
        exact = torch.nn.functional.linear(x, weight, layer.bias)
        out = layer(x)
        error = ((out - exact).norm(dim=-1) / exact.norm(dim=-1)).max()
        assert error < 0.02, f"{path} {kind} {width}: relative error {error:.4f}"


def test_a_whole_int4_model_gives_the_same_logits_on_every_path(tmp_path):
    import specdec
    from tests.conftest import make_tiny_model_dir
    from tests.model_fixtures import TINY_QWEN2_Q4, assert_chunk_equals_single_tokens

    target = specdec.load_model(make_tiny_model_dir(tmp_path / "t", TINY_QWEN2_Q4, seed=3), dtype="float32",
                                device="cpu", quantize="int4")
    decoder = target.backend.decoder
    tokens = torch.tensor([5, 9, 2, 77, 31, 8, 4, 19])
    logits = {}
    for name in kernel_paths():
        with use_kernel_path(name):
            assert_chunk_equals_single_tokens(decoder, 6)
            logits[name] = decoder(tokens, torch.arange(len(tokens)), decoder.new_cache(16))
    for name, value in logits.items():
        assert torch.equal(value, logits[kernel_paths()[0]]), name


def test_the_environment_can_name_the_path_for_a_whole_command():
    import subprocess
    import sys

    script = "from specdec.kernels.build import kernel_path; print(kernel_path())"
    env = {**os.environ, "SPECDEC_KERNEL_PATH": "avx2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "avx2", done.stderr
    env["SPECDEC_KERNEL_PATH"] = "avx9000"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "SPECDEC_KERNEL_PATH=avx9000: this CPU runs" in done.stderr


def test_decode_rows_in_groups_of_four_with_a_remainder_match_the_chunk():
    """A one-row call computes weight rows four at a time (dot_weight_rows) and the rest one by one: with
    37 outputs (9 groups and 1 left over, over two tiles) every row must still equal the chunk's."""
    gen = torch.Generator().manual_seed(11)
    for width in (896, 1536):
        layer = Q4Linear.from_float(torch.randn(37, width, generator=gen) * 0.05, torch.randn(37, generator=gen))
        x = make_rows(5, width, seed=width)
        chunk = layer(x)
        for i in range(5):
            assert torch.equal(chunk[i], layer(x[i : i + 1])[0]), f"width {width}: row {i}"


def test_layers_made_inside_layers_built_with_take_that_module():
    """kernel_ab.py's hook: layers made inside take the given build, later layers this one again."""
    from specdec.kernels import build

    own = build.kernel()
    sentinel = object()
    with build.layers_built_with(sentinel):
        assert build.kernel() is sentinel
    assert build.kernel() is own


# (heads, kv_heads, head_dim): Qwen2.5 1.5B / 0.5B / 7B groups (6, 7, 7), no grouping, pairs only, an odd
# group of 5 with a 40-wide head (value chunks of 32 and 8), a head wider than the AVX-512 kernels take
ATTENTION_SHAPES = [(12, 2, 128), (14, 2, 64), (28, 4, 128), (8, 8, 64), (8, 2, 96), (10, 2, 40), (4, 2, 320)]


def attention_inputs(heads: int, kv_heads: int, dim: int, rows: int, start: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    capacity = start + rows + 3
    k_cache, v_cache = (c.contiguous() for c in torch.randn(2, kv_heads, capacity, dim, generator=gen).unbind(0))
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=gen)
    cos, sin = (t.contiguous() for t in torch.randn(2, rows, dim, generator=gen).unbind(0))
    return qkv, cos, sin, k_cache, v_cache


@pytest.mark.parametrize("heads,kv_heads,dim", ATTENTION_SHAPES)
def test_attention_gives_the_same_bits_on_every_path_alone_and_in_a_chunk(heads, kv_heads, dim):
    """The attention kernels (AVX2: heads in threes, 256-bit chains; AVX-512: two heads per register): every
    path the same bits, and each row of a 9-row chunk over 150 cached slots (three key blocks, a partial
    one) equal to that row decoded alone after the rows before it."""
    ops = kernel()
    rows, start = 9, 150
    qkv, cos, sin, k_cache, v_cache = attention_inputs(heads, kv_heads, dim, rows, start, seed=heads + dim)
    outputs = {}
    for name in kernel_paths():
        with use_kernel_path(name):
            outputs[name] = ops.attention(qkv, cos, sin, k_cache.clone(), v_cache.clone(), start, heads, kv_heads, None)
            keys, values = k_cache.clone(), v_cache.clone()
            for t in range(rows):
                one = ops.attention(qkv[t : t + 1], cos[t : t + 1], sin[t : t + 1], keys, values, start + t, heads,
                                    kv_heads, None)
                assert torch.equal(one[0], outputs[name][t]), f"{name}: row {t} alone differs from the chunk"
    for name, out in outputs.items():
        assert torch.equal(out, outputs["avx2"]), f"{name} differs from avx2"


def test_a_long_chunk_in_token_tiles_gives_every_row_its_bits_alone():
    """Many rows (a prompt pass) run in tiles of 32 tokens (layer_ops.cpp ``kTile``): 100 rows after 30
    cached slots — four tiles, the last partial — each equal to that row alone after the rows before
    it, on every path; under a mask too (a tile's rows then see scattered slots). And every path the
    same bits: rows of 31–130 visible slots take each branch of the softmax normaliser (16-lane chunks
    on AVX-512, an 8-lane chunk, a tail)."""
    ops = kernel()
    heads, kv_heads, dim, rows, start = 12, 2, 128, 100, 30
    qkv, cos, sin, k_cache, v_cache = attention_inputs(heads, kv_heads, dim, rows, start, seed=7)
    gen = torch.Generator().manual_seed(8)
    mask = (torch.rand(rows, start + rows, generator=gen) < 0.6).tril(start)
    mask |= torch.nn.functional.pad(torch.eye(rows, dtype=torch.bool), (start, 0))  # each row sees itself
    chunks = {}
    for name in kernel_paths():
        with use_kernel_path(name):
            for rule in (None, mask):
                chunk = ops.attention(qkv, cos, sin, k_cache.clone(), v_cache.clone(), start, heads, kv_heads, rule)
                chunks[name, rule is None] = chunk
                keys, values = k_cache.clone(), v_cache.clone()
                for t in range(rows):
                    alone = ops.attention(qkv[t : t + 1], cos[t : t + 1], sin[t : t + 1], keys, values, start + t, heads,
                                          kv_heads, None if rule is None else rule[t : t + 1, : start + t + 1])
                    assert torch.equal(alone[0], chunk[t]), f"{name}: row {t} alone differs from the chunk"
    for (name, causal), chunk in chunks.items():
        assert torch.equal(chunk, chunks["avx2", causal]), f"{name} differs from avx2"


def test_attention_under_a_tree_mask_gives_the_same_bits_on_every_path():
    """Tree rows see scattered slots (every third prefix slot hidden, siblings hidden from each other)."""
    ops = kernel()
    heads, kv_heads, dim, rows, start = 12, 2, 128, 5, 70
    qkv, cos, sin, k_cache, v_cache = attention_inputs(heads, kv_heads, dim, rows, start, seed=1)
    mask = torch.ones(rows, start + rows, dtype=torch.bool)
    mask[:, 0:start:3] = False
    mask[:, start:] = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0],
                                    [1, 0, 1, 0, 1]], dtype=torch.bool)
    outputs = {}
    for name in kernel_paths():
        with use_kernel_path(name):
            outputs[name] = ops.attention(qkv, cos, sin, k_cache.clone(), v_cache.clone(), start, heads, kv_heads, mask)
    for name, out in outputs.items():
        assert torch.equal(out, outputs["avx2"]), f"{name} differs from avx2"


@pytest.fixture
def q4_amx():
    """The extension with the 4-bit linear on AMX tiles from one row (restored after); skips without AMX."""
    module = kernel()
    if not module.q4_amx_min_rows():
        pytest.skip("no AMX-INT8 here (or the OS did not grant this process its tile state)")
    with use_q4_amx_rows(1):
        yield module


# whole blocks only (a partial last block runs the VNNI code); 17 and 40 outputs: panels of 16 with a tail
@pytest.mark.parametrize("width,outputs", [(768, 40), (2048, 17), (896, 40)])
def test_the_4bit_linear_on_amx_tiles_gives_every_paths_bits(q4_amx, width, outputs):
    gen = torch.Generator().manual_seed(width)
    layer = Q4Linear.from_float(torch.randn(outputs, width, generator=gen) * 0.05, torch.randn(outputs, generator=gen))
    x = make_rows(35, width, seed=width)
    # the layer's AMX copy exists for whole blocks only (so the comparison below compares two different codes)
    assert (layer.amx_copy() is not None) == (width % 256 == 0)
    for rows in (1, 2, 5, 9, 16, 17, 35):  # 35: three 16-row tile passes over each panel
        on_amx = layer(x[:rows])
        with use_q4_amx_rows(0):
            on_vnni = layer(x[:rows])
        with use_kernel_path("avx2"):
            on_avx2 = layer(x[:rows])
        assert torch.equal(on_amx, on_vnni), f"{rows} rows"
        assert torch.equal(on_amx, on_avx2), f"{rows} rows"
    alone = torch.cat([layer(x[i : i + 1]) for i in range(35)])
    assert torch.equal(layer(x), alone)


def test_a_whole_int4_model_gives_the_same_logits_on_amx_tiles(q4_amx, tmp_path):
    """Through the C++ layer loop: its 4-bit layers carry their AMX copies, and prefill, chunks and single
    tokens give the VNNI path's bits."""
    import specdec
    from tests.conftest import make_tiny_model_dir
    from tests.model_fixtures import TINY_QWEN2_Q4

    target = specdec.load_model(make_tiny_model_dir(tmp_path / "t", TINY_QWEN2_Q4, seed=3), dtype="float32",
                                device="cpu", quantize="int4")
    decoder = target.backend.decoder
    specs = [linear.spec() for linear in decoder.modules() if isinstance(linear, Q4Linear)]
    assert specs and all(len(tensors) == 6 for _, tensors, _ in specs)  # the copy rides along to the C++ loop
    tokens = torch.tensor([5, 9, 2, 77, 31, 8, 4, 19, 23, 6, 11])

    def steps() -> torch.Tensor:
        cache = decoder.new_cache(16)
        return torch.cat([decoder(tokens[a:b], torch.arange(a, b), cache) for a, b in ((0, 9), (9, 10), (10, 11))])

    on_amx = steps()
    with use_q4_amx_rows(0):
        on_vnni = steps()
    assert torch.equal(on_amx, on_vnni)


def test_a_4bit_layer_refuses_an_amx_copy_that_is_not_its_own(q4_amx):
    gen = torch.Generator().manual_seed(1)
    layer = Q4Linear.from_float(torch.randn(32, 512, generator=gen), None)
    other = Q4Linear.from_float(torch.randn(48, 512, generator=gen), None)
    x = make_rows(3, 512, seed=1)
    with pytest.raises(RuntimeError, match="the AMX copy does not match this layer"):
        q4_amx.q4_linear(x, layer.qs, layer.sc, layer.mn, layer.d, layer.dmin, None, other.amx_copy())
    partial = Q4Linear.from_float(torch.randn(16, 320, generator=gen), None)  # a partial last block: VNNI only
    assert partial.amx_copy() is None
    with pytest.raises(RuntimeError, match="whole blocks of 256"):
        q4_amx.q4_amx_repack(partial.qs, partial.sc, partial.mn, partial.d, partial.dmin)


def test_turning_the_4bit_amx_path_off_spares_its_copy(q4_amx, monkeypatch):
    for off in ("0", "00"):  # whatever the threshold reads as 0 (build.q4_amx_rows_from_env, one reader)
        monkeypatch.setenv("SPECDEC_Q4_AMX_ROWS", off)
        layer = Q4Linear.from_float(torch.randn(16, 256), None)
        assert layer.amx_copy() is None and len(layer.spec()[1]) == 5


def test_the_4bit_amx_threshold_is_restored_after_a_block(q4_amx):
    with use_q4_amx_rows(0):
        assert q4_amx.q4_amx_min_rows() == 0
        with use_kernel_path("avx2"), use_q4_amx_rows(5):  # the path hides the threshold; it is still restored
            assert q4_amx.q4_amx_min_rows() == 0
        assert q4_amx.q4_amx_threshold() == 0
    assert q4_amx.q4_amx_min_rows() == 1


def test_the_4bit_amx_threshold_is_checked_and_follows_the_path(q4_amx):
    with pytest.raises(RuntimeError, match="rows must be >= 0"):
        q4_amx.set_q4_amx_min_rows(-1)
    assert q4_amx.q4_amx_min_rows() == 1
    with use_kernel_path("avx2"):  # the AVX2 path never runs AMX (every path is tested on its own code)
        assert q4_amx.q4_amx_min_rows() == 0


def test_the_4bit_amx_threshold_comes_from_the_environment(q4_amx, monkeypatch):
    from specdec.kernels import build
    from specdec.kernels.int8 import kernels_note

    monkeypatch.setenv("SPECDEC_Q4_AMX_ROWS", "many")
    with pytest.raises(SpecdecError, match="SPECDEC_Q4_AMX_ROWS='many'"):
        build._loaded(q4_amx)
    monkeypatch.setenv("SPECDEC_Q4_AMX_ROWS", "0")
    build._loaded(q4_amx)
    assert q4_amx.q4_amx_min_rows() == 0 and "int4 on AMX" not in kernels_note(["int4"])
    monkeypatch.setenv("SPECDEC_Q4_AMX_ROWS", "32")
    build._loaded(q4_amx)
    assert ", int4 on AMX from 32 rows" in kernels_note(["int4"])


def test_the_step_cost_cache_names_the_4bit_amx_threshold(q4_amx):
    from specdec.kernels.build import amx_key

    assert amx_key() == "-amx1"  # the fixture's threshold
    with use_q4_amx_rows(0):
        assert amx_key() == "-amx0"
