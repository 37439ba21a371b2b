"""Training data for feature heads: text → token sequences → the target's features, by teacher forcing.

A head learns from what the target computes over real text: for every position its final hidden
state (the feature EAGLE extrapolates) and its greedy next token. One prefill per sequence gives
both for all positions at once — the cheap way to make training data (no generation).

The default corpus is real code that is on every machine: the Python standard library's sources
(``--data stdlib``). A text file, a JSONL file (``text``, ``prompt``/``completion`` or ``turns``
fields) or a directory of ``.py``/``.txt``/``.md`` files works too. Documents are split whole into a
training and a held-out part (by a hash of their name, so the split is stable as data grows).

Features are written in shards (``shard-00000.safetensors``: ``tokens [N, T]`` int32, ``features
[N, T, hidden × layers]`` float16, ``target_ids [N, T]`` int32, ``feature_layers [layers]`` int32:
which of the target's layers the features are, side by side — absent in shards written before it,
which hold the final one) into the output directory; an interrupted extraction resumes at the first
missing shard. Shards recorded at several layers (EAGLE-3's) train a head of any subset of them
(:func:`select_layers`).
"""

from __future__ import annotations

import hashlib
import json
import random
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from specdec.bench.datasets import DOCUMENT_FIELDS, ROW_FILE_SUFFIXES, dataset_path, document_text, read_jsonl
from specdec.errors import SpecdecError
from specdec.paths import write_safetensors
from specdec.threads import adapt_threads

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")
#: one document in this many is held out (by a hash of its name)
HELD_OUT_EVERY = 20
#: documents' tails shorter than this are dropped (too little context to learn from)
MIN_SEQUENCE = 32


@dataclass(frozen=True)
class Document:
    name: str
    text: str

    @property
    def held_out(self) -> bool:
        return int(hashlib.sha1(self.name.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def stdlib_documents() -> list[Document]:
    """The Python standard library's ``.py`` sources (tests included: real code), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            docs.append(Document(str(path.relative_to(root)), text))
    return docs


def file_documents(path: Path) -> list[Document]:
    """Documents from a text/JSONL file or a directory of text files; a clear error for anything else."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
        if not files:
            raise SpecdecError(f"{path} holds no {'/'.join(TEXT_SUFFIXES)} files to train on")
        return [Document(str(p.relative_to(path)), p.read_text(encoding="utf-8", errors="replace")) for p in files]
    if not path.is_file():
        raise SpecdecError(f"training data not found: {path} (give a file, a directory, or 'stdlib')")
    if path.suffix in ROW_FILE_SUFFIXES:
        docs = []
        for row in read_jsonl(path, text_files_read=True):  # errors name the file and line
            text = document_text(row)
            if text is None:
                raise SpecdecError(f"{path}:{row['_line']}: no {DOCUMENT_FIELDS} field")
            docs.append(Document(f"{path.name}:{row['_line']}", text))
        return docs
    return [Document(path.name, path.read_text(encoding="utf-8", errors="replace"))]


def load_documents(source: str) -> list[Document]:
    """``--data``: 'stdlib', a dataset name (humaneval, gsm8k, spec_bench) or a file or folder."""
    return stdlib_documents() if source == "stdlib" else file_documents(dataset_path(source))


def token_sequences(docs: list[Document], encode: Callable[[str], list[int]], seq_len: int,
                    held_out: bool, seed: int = 0) -> list[list[int]]:
    """Each document of the chosen split, tokenized and cut into ``seq_len``-token pieces (a tail
    shorter than MIN_SEQUENCE dropped), in a seeded random order (so a budget cut sees every kind)."""
    sequences = []
    for doc in docs:
        if doc.held_out != held_out:
            continue
        ids = encode(doc.text)
        for begin in range(0, len(ids), seq_len):
            piece = ids[begin : begin + seq_len]
            if len(piece) >= min(MIN_SEQUENCE, seq_len):
                sequences.append(piece)
    random.Random(seed).shuffle(sequences)
    return sequences


@torch.inference_mode()
def teacher_forced(backend, tokens: list[int], layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001 - TorchBackend
    """One prefill of ``tokens [T]``: the target's hidden states at ``layers`` (default: the final
    one, before the final norm) ``[T, hidden × layers]`` and its greedy next token after each
    position ``[T]``."""
    adapt_threads(backend.device)  # each sequence a prefill: on the cores other processes leave, as decoding does
    state = backend.new_state(len(tokens))
    state.record_features(backend.config.hidden_size, layers)
    logits = backend.forward(state, tokens)
    return state.features[: len(tokens)].clone(), logits.argmax(dim=-1)


def shard_path(directory: Path, index: int) -> Path:
    return directory / f"shard-{index:05d}.safetensors"


def write_shard(path: Path, rows: list[tuple[list[int], torch.Tensor, torch.Tensor]], layers: tuple[int, ...]) -> None:
    """One shard of ``rows`` — ``(tokens [T], features [T, hidden × layers], target_ids [T])`` each,
    padded to the longest with token -1 — recorded at the target's ``layers``, written whole or not
    at all (a ``.partial`` file renamed)."""
    longest = max(len(tokens) for tokens, _, _ in rows)
    tokens = torch.full((len(rows), longest), -1, dtype=torch.int32)
    targets = torch.full((len(rows), longest), -1, dtype=torch.int32)
    features = torch.zeros(len(rows), longest, rows[0][1].shape[-1], dtype=torch.float16)
    for row, (seq, feats, greedy) in enumerate(rows):
        tokens[row, : len(seq)] = torch.tensor(seq, dtype=torch.int32)
        targets[row, : len(seq)] = greedy.to(torch.int32)
        features[row, : len(seq)] = feats.to(torch.float16)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors({"tokens": tokens, "target_ids": targets, "features": features,
                       "feature_layers": torch.tensor(layers, dtype=torch.int32)}, path)


def extract_features(backend, sequences: list[list[int]], directory: Path, layers: tuple[int, ...],  # noqa: ANN001
                     shard_size: int = 32, budget_seconds: float | None = None, progress: bool = False) -> int:
    """Write the teacher-forced features at ``layers`` of ``sequences`` (equal lengths per shard are
    not needed: each shard pads to its longest with token -1) into shards of ``shard_size``
    sequences; skip shards already written (resume). Stops starting new shards after
    ``budget_seconds``. Returns the number of shards present."""
    from tqdm import tqdm

    directory.mkdir(parents=True, exist_ok=True)
    count = (len(sequences) + shard_size - 1) // shard_size
    start = time.perf_counter()
    bar = tqdm(total=count, desc=f"target features → {directory.name}", unit="shard", disable=not progress)
    done = 0
    for index in range(count):
        path = shard_path(directory, index)
        if path.is_file():
            bar.update(1)
            done += 1
            continue
        if budget_seconds is not None and time.perf_counter() - start > budget_seconds:
            break
        batch = sequences[index * shard_size : (index + 1) * shard_size]
        write_shard(path, [(seq, *teacher_forced(backend, seq, layers)) for seq in batch], layers)
        bar.update(1)
        done += 1
    bar.close()
    return done


def add_minutes(path: Path, minutes: float) -> float:
    """The minutes every run spent on one stage (its record: ``path``, e.g. ``extraction.json``), this
    one's ``minutes`` added: a resumed run extracts or generates little or nothing itself, and the
    report must still say what the data cost."""
    total = (json.loads(path.read_text())["minutes"] if path.is_file() else 0.0) + minutes
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"minutes": total}) + "\n")
    return total


def iter_shards(directory: Path) -> Iterator[dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    index = 0
    while shard_path(directory, index).is_file():
        yield load_file(str(shard_path(directory, index)))
        index += 1


def load_shards(*directories: Path, num_layers: int, layers: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Every shard's rows in ``directories``, concatenated (padded to the longest sequence with token
    -1), with the features of the target's ``layers`` (of its ``num_layers``) alone: each shard must
    hold them (:func:`select_layers`)."""
    shards = [select_layers(shard, num_layers, layers) for directory in directories for shard in iter_shards(directory)]
    if not shards:
        raise SpecdecError(f"no feature shards in {' or '.join(str(d) for d in directories)}")
    longest = max(s["tokens"].shape[1] for s in shards)

    def pad(t: torch.Tensor, value: float) -> torch.Tensor:
        extra = longest - t.shape[1]
        if extra == 0:
            return t
        shape = (t.shape[0], extra, *t.shape[2:])
        return torch.cat([t, torch.full(shape, value, dtype=t.dtype)], dim=1)

    return {"tokens": torch.cat([pad(s["tokens"], -1) for s in shards]),
            "target_ids": torch.cat([pad(s["target_ids"], -1) for s in shards]),
            "features": torch.cat([pad(s["features"], 0) for s in shards])}


def select_layers(shard: dict[str, torch.Tensor], num_layers: int, layers: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """``shard`` with the features of ``layers`` alone, side by side in that order (a shard without
    ``feature_layers`` holds the final one, ``num_layers``); a clear error where it lacks one."""
    have = shard["feature_layers"].tolist() if "feature_layers" in shard else [num_layers]
    missing = [layer for layer in layers if layer not in have]
    if missing:
        raise SpecdecError(f"the feature shards hold the target's layers {have}, not {missing}: extract them again "
                           "into a fresh --out (or train a head that reads the layers they hold)")
    if list(layers) == have:
        return shard
    width = shard["features"].shape[-1] // len(have)
    parts = [shard["features"][..., have.index(layer) * width : (have.index(layer) + 1) * width] for layer in layers]
    return dict(shard, features=torch.cat(parts, dim=-1), feature_layers=torch.tensor(layers, dtype=torch.int32))
