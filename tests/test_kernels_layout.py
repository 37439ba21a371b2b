"""specdec/kernels/ as a layer of its own (issue 20): the extension's name, the import direction
(the loader meets the kernels; the decoder and the kernels never import each other; no
function-local imports hiding a cycle; no environment writes), and the decoder's explicit interface
for kernels — fused projections and the layer runner — set and cleared through its methods."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import specdec
from specdec.kernels import build
from specdec.kernels.convert import quantize_decoder
from specdec.kernels.int8 import Int8Linear
from specdec.models.transformer import Decoder
from specdec.models.weights import load_decoder
from tests.model_fixtures import TINY_QWEN2, write_tiny_model

PACKAGE = Path(specdec.__file__).parent
KERNELS = sorted((PACKAGE / "kernels").glob("*.py"))
#: what the kernels may import of specdec: themselves and the package's leaves
KERNEL_DEPENDENCIES = ("specdec.kernels", "specdec.errors", "specdec.paths", "specdec.cpu")


def specdec_imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module named, line, at module level?) for every import of a specdec module in ``path``."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [(name, node.lineno, id(node) in top_level) for name in names if name.startswith("specdec")]
    return found


def test_the_extension_is_named_for_what_it_holds():
    assert build.EXTENSION_NAME == "specdec_cpu_kernels"
    assert build.build_directory().name.startswith("specdec_cpu_kernels-")  # never an old specdec_q4 build
    assert all(path.is_file() and path.parent == PACKAGE / "kernels" for path in build.SOURCES + build.HEADERS)
    if build.unsupported_reason() is None and build.available():
        module = build.kernel()
        assert module.__name__ == "specdec_cpu_kernels"
        assert {"q4_linear", "q6_linear", "q8_linear", "rms_norm", "attention"} <= set(dir(module))


def test_the_decoder_imports_nothing_from_the_kernels():
    for module in ("transformer", "config", "kv_cache"):
        imports = specdec_imports(PACKAGE / "models" / f"{module}.py")
        assert not [name for name, _, _ in imports if name.startswith("specdec.kernels")], module
    assert "__dict__[" not in (PACKAGE / "models" / "transformer.py").read_text()


def test_kernels_import_only_kernels_and_leaves_at_module_level():
    assert KERNELS and not list((PACKAGE / "models").glob("*.cpp"))
    for path in KERNELS:
        for name, line, top_level in specdec_imports(path):
            assert name.startswith(KERNEL_DEPENDENCIES), f"{path.name}:{line} imports {name}"
            assert top_level, f"{path.name}:{line}: a function-local import (hides a cycle)"


def test_kernels_write_no_environment():
    for path in KERNELS:
        for node in ast.walk(ast.parse(path.read_text())):
            target = None
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                target = next((t for t in targets if isinstance(t, ast.Subscript)), None)
                target = None if target is None else ast.unparse(target.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                call = ast.unparse(node.func)
                if call in ("os.putenv", "os.unsetenv") or (
                        call.startswith("os.environ.") and node.func.attr in ("update", "setdefault", "pop", "clear")):
                    target = "os.environ"
            assert target != "os.environ", f"{path.name}:{node.lineno} writes the environment"


@pytest.fixture
def tiny_int8(tmp_path):
    write_tiny_model(tmp_path, TINY_QWEN2, seed=5)
    return lambda fuse: quantize_decoder(load_decoder(tmp_path), fuse=fuse)


def _decode(decoder: Decoder) -> torch.Tensor:
    """A prefill of 9 tokens, then a chunk of 3 and a single token: every path a step takes."""
    ids = torch.arange(13) * 37 % 512
    cache = decoder.new_cache(16)
    outs = [decoder(ids[a:b], torch.arange(a, b), cache) for a, b in ((0, 9), (9, 12), (12, 13))]
    return torch.cat(outs)


def test_fused_projections_set_and_cleared_through_the_modules(tiny_int8):
    decoder = tiny_int8(False)
    runner = decoder.layer_runner
    decoder.set_layer_runner(None)  # the Python layers read fused_qkv / fused_gate_up on every call
    reference = _decode(decoder)
    keys, modules = set(decoder.state_dict()), [name for name, _ in decoder.named_modules()]
    for layer in decoder.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.set_fused_projections(Int8Linear.concat([getattr(attn, n) for n in attn.FUSABLE_PROJECTIONS]))
        mlp.set_fused_projections(Int8Linear.concat([mlp.gate_proj, mlp.up_proj]))
        assert isinstance(attn.fused_qkv, Int8Linear) and isinstance(mlp.fused_gate_up, Int8Linear)
    # outside the module tree: nothing serialized or listed changes
    assert set(decoder.state_dict()) == keys and [name for name, _ in decoder.named_modules()] == modules
    assert torch.equal(_decode(decoder), reference)
    if runner is not None:  # the C++ glue, made after the fusing, calls the fused kernels
        from specdec.kernels.layers import CppLayers

        decoder.set_layer_runner(CppLayers(decoder))
        with_runner = _decode(decoder)
        decoder.set_layer_runner(runner)  # the unfused glue: fused or not, the same bits
        assert torch.equal(_decode(decoder), with_runner)
        decoder.set_layer_runner(None)
    for layer in decoder.model.layers:
        layer.self_attn.set_fused_projections(None)
        layer.mlp.set_fused_projections(None)
        assert layer.self_attn.fused_qkv is None and layer.mlp.fused_gate_up is None
    assert torch.equal(_decode(decoder), reference)


def test_a_fused_projection_of_the_wrong_size_is_refused(tiny_int8):
    attn = tiny_int8(False).model.layers[0].self_attn
    with pytest.raises(ValueError, match="q_proj|k_proj|v_proj"):
        attn.set_fused_projections(Int8Linear.concat([attn.q_proj, attn.k_proj]))  # v is missing
    assert attn.fused_qkv is None


def test_the_layer_runner_is_set_and_cleared_through_the_decoder(tiny_int8):
    decoder = tiny_int8(True)
    decoder.set_layer_runner(None)
    assert decoder.layer_runner is None
    python_path = _decode(decoder)
    calls = []

    def spy(self, *args):  # the runner protocol: Decoder._run_layers' signature and results
        calls.append(args[-1])
        return Decoder._run_layers(self, *args)

    decoder.set_layer_runner(spy)
    assert torch.equal(_decode(decoder), python_path)
    assert [list(run) for run in calls] == [list(range(TINY_QWEN2["num_hidden_layers"]))] * 3
    decoder.set_layer_runner(None)
    assert torch.equal(_decode(decoder), python_path) and len(calls) == 3


def test_head_rows_asks_the_head_layer(tiny_int8):
    """Decoder.head_rows knows no kernel class: a quantized head cuts itself (first_rows)."""
    decoder = tiny_int8(True)
    hidden = torch.randn(3, TINY_QWEN2["hidden_size"], generator=torch.Generator().manual_seed(0))
    cut = decoder.head_rows(100)
    assert isinstance(cut, Int8Linear) and cut.out_features == 100
    assert torch.equal(cut(hidden), decoder.lm_head(hidden)[:, :100])
