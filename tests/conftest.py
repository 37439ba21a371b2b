"""Shared fixtures: tiny random models with a real (tiny, trained) byte-level BPE tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.model_fixtures import TINY_QWEN2, write_tiny_model


def make_tiny_model_dir(out_dir: Path, config: dict = TINY_QWEN2, seed: int = 0) -> Path:
    from tests.tokenizer_fixtures import write_tiny_tokenizer

    write_tiny_model(out_dir, config, seed)
    write_tiny_tokenizer(out_dir)
    return out_dir


@pytest.fixture(scope="session", autouse=True)
def prompt_attention_choice_of_the_tests(tmp_path_factory):
    """Tests that load a prompt twin time the prompt-attention choice (specdec/kernels/prompt_attention.py) into a
    file of their own, not this machine's: a test run beside other work must not fix the choice later runs read."""
    from specdec.kernels import prompt_attention

    path = tmp_path_factory.mktemp("prompt-attention") / "choice.json"
    machine_file = prompt_attention.choice_file
    prompt_attention.choice_file = lambda: path
    yield path
    prompt_attention.choice_file = machine_file


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """``target`` and an unrelated ``draft`` (different random weights, same tokenizer)."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "target": make_tiny_model_dir(root / "target", seed=0),
        "draft": make_tiny_model_dir(root / "draft", seed=1),
    }


@pytest.fixture(scope="module")
def server(tiny_dirs):
    """A real `specdec serve` of the tiny pair with the default flags, one per test module (a module
    that needs other flags defines its own ``server``)."""
    from tests.test_server import serving, start_server

    with serving(start_server(tiny_dirs)) as base:
        yield base


@pytest.fixture(scope="session")
def tiny_target(tiny_dirs):
    import specdec

    return specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tiny_draft(tiny_dirs):
    import specdec

    return specdec.load_model(tiny_dirs["draft"], dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only add wake-up latency (milliseconds on a loaded 2-core box)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def int4_kernel():
    """The int4/int4-all C++ kernels, built on first use. Where they cannot be built (no g++/ninja,
    no AVX2) the int8 path still works, so a test that needs them is skipped and says why; in CI,
    whose machine can build them, that is a failure instead."""
    from specdec.kernels.build import kernel

    try:
        return kernel()
    except Exception as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"int4 C++ extension could not be built here: {exc}")


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    """`-m "not slow"` drops the real-model tests with only a count; say what was left out and how to run it."""
    slow = [item for item in terminalreporter.stats.get("deselected", []) if item.get_closest_marker("slow")]
    if slow:
        files = ", ".join(sorted({item.path.name for item in slow}))
        terminalreporter.write_line(f"{len(slow)} slow tests (the real default models) deselected by -m 'not slow' "
                                    f"in {files}: `make test` runs them")
