"""``specdec datastore build``: turn a corpus (.txt files, .jsonl rows or a dataset's, read as
``train-drafter --data`` reads them) into the token suffix-array datastore that ``--method
retrieval`` (REST) drafts from, tokenized with the target model's tokenizer."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator

from specdec.bench.datasets import DOCUMENT_FIELDS
from specdec.cli.common import DEFAULT_TARGET, add_debug_flag
from specdec.cli.values import bounded_int
from specdec.drafters.retrieval import MAX_WINDOW
from specdec.errors import SpecdecError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    store = subparsers.add_parser("datastore", help="build a retrieval datastore (for --method retrieval)",
                                  description="Tokenize a corpus with a model's tokenizer and build a suffix-array datastore "
                                              "for retrieval drafting (REST). Inputs: .txt files (one document each), .jsonl "
                                              f"or .json arrays (per row: {DOCUMENT_FIELDS}) or a dataset (humaneval, gsm8k, spec_bench).")
    store.add_argument("action", choices=["build"], help="build: tokenize the --input files and write the datastore to --output (the only action)")
    store.add_argument("--tokenizer", default=DEFAULT_TARGET,
                       help=f"model whose tokenizer to use: the target's, which --method retrieval will run with (default: {DEFAULT_TARGET})")
    store.add_argument("--input", nargs="+", required=True, metavar="FILE", help="corpus files (.txt, .jsonl, or .json holding an array of rows) or dataset names")
    store.add_argument("--output", required=True, metavar="DIR", help="datastore directory to write")
    store.add_argument("--window", type=lambda text: bounded_int(text, 1, "a number of tokens", MAX_WINDOW), default=16,
                       help=f"longest match length indexed, in tokens, 1..{MAX_WINDOW} (default: 16)")
    store.add_argument("--no-pull", action="store_true", help="fail instead of pulling a missing built-in model")
    add_debug_flag(store)
    store.set_defaults(func=run)
    return store


def read_corpus(files: list[str], skipped: Counter[str] | None = None) -> Iterator[str]:
    """The documents of ``files``, one string each (a .txt file is one document, a .jsonl row another;
    a dataset name reads its JSONL file). Every file is checked to exist before the first is read (a missing
    one was found after minutes of tokenizing the others). Binary files (NUL bytes) and empty documents are
    skipped and counted in ``skipped`` ("binary", "empty"): an empty `__init__.py` row stopped a whole build."""
    from specdec.bench.datasets import ROW_FILE_SUFFIXES, dataset_path, document_text, read_jsonl

    skipped = Counter() if skipped is None else skipped
    paths = [dataset_path(name) for name in files]
    for path in paths:
        if path.is_dir():
            raise SpecdecError(f"--input {path} is a folder: give its files (e.g. {path}/*.py)")
        if not path.is_file():
            raise SpecdecError(f"corpus file not found: {path}")
    for path in paths:
        if path.suffix not in ROW_FILE_SUFFIXES:
            data = path.read_bytes()
            if b"\0" in data:  # /bin/ls was indexed as 118k tokens of replacement characters
                skipped["binary"] += 1
                continue
            text = data.decode("utf-8", errors="replace")  # a stray byte in a source file is no reason to refuse it
            if text.strip():
                yield text
            else:
                skipped["empty"] += 1
            continue
        for row in read_jsonl(path, text_files_read=True):
            text = document_text(row)
            if text is None and any(field in row and not row[field] for field in ("text", "prompt", "question", "turns")):
                skipped["empty"] += 1  # a document with nothing in it
                continue
            if text is None:
                raise SpecdecError(f"{path}:{row['_line']}: needs a {DOCUMENT_FIELDS} field")
            yield text


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specdec.bench.datasets import ROW_FILE_SUFFIXES, dataset_path
    from specdec.drafters.retrieval import build_datastore
    from specdec.models.registry import resolve_model
    from specdec.tokenizer import Tokenizer

    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise SpecdecError(f"--output {args.output}: is a file; give a folder for the datastore")
    existing = Path(args.output) / "meta.json"
    if existing.is_file():  # a 100-document store was replaced by a 12-token one without a word
        print(f"note: replacing the datastore in {args.output}", file=sys.stderr)
    tokenizer = Tokenizer.load(resolve_model(args.tokenizer, auto_pull=not args.no_pull))
    # text files are one document each: the progress bar's end is known
    total = None if any(dataset_path(name).suffix in ROW_FILE_SUFFIXES for name in args.input) else len(args.input)
    skipped: Counter[str] = Counter()

    def left_out() -> str:
        return ", ".join(f"{count} {kind} file{'s' if count != 1 else ''}" if kind == "binary" else
                         f"{count} empty document{'s' if count != 1 else ''}" for kind, count in sorted(skipped.items()))

    try:
        meta = build_datastore(tokenizer, read_corpus(args.input, skipped), Path(args.output), window=args.window,
                               progress=True, total=total)
    except SpecdecError as exc:  # "the corpus is empty" for a corpus of binary files: say what was skipped
        raise SpecdecError(f"{exc} (skipped {left_out()})" if skipped else str(exc)) from None
    documents = meta["documents"]
    print(f"datastore {args.output}: {documents} document{'s' if documents != 1 else ''}, {meta['tokens']} tokens"
          + (f" (skipped {left_out()})" if skipped else ""), file=sys.stderr)
    return 0
