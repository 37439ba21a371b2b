"""Small Python module corpora for train-drafter tests: the text it trains on and, with docstrings,
the prompts self-distillation (--generate-minutes) continues."""

from __future__ import annotations

from pathlib import Path


def module_corpus(tmp_path: Path, files: int = 40, functions: int = 30, docstring: str = "") -> Path:
    """``tmp_path/corpus`` with ``files`` modules of ``functions`` one-line functions ``f{i}_{j}``,
    each with the docstring ``docstring`` (formatted with ``j``; empty: none)."""
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(files):
        doc = (lambda j: f'    """{docstring.format(j=j)}"""\n') if docstring else (lambda j: "")
        (root / f"mod{i}.py").write_text("".join(f"def f{i}_{j}(x):\n{doc(j)}    return x * {j} + {i}\n\n"
                                                 for j in range(functions)))
    return root
