"""Retrieval-based drafting (REST, He et al. 2023): continue the longest suffix of the context that
occurs in a datastore built from a corpus, with the most frequent continuation among its matches.

The datastore (``specdec datastore build``) is the corpus' token ids plus a suffix array truncated to
``window`` tokens (enough: we never match longer), both ``.npy`` files memory-mapped at load, and a
fingerprint of the tokenizer so a datastore built with another vocabulary is refused clearly.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable

import numpy as np

from specdec.drafters.base import Draft, Drafter, DrafterResources, MethodInfo
from specdec.errors import SpecdecError

FORMAT_VERSION = 1
SEPARATOR = -1  # between documents: never matches a real token


#: the longest match a datastore may index (the drafter matches at most 12 tokens by default)
MAX_WINDOW = 64


def build_datastore(tokenizer, texts: Iterable[str], output: Path, window: int = 16, progress: bool = False,  # noqa: ANN001
                    total: int | None = None) -> dict:
    """Tokenize ``texts`` and write ``tokens.npy``, ``suffix_array.npy`` and ``meta.json`` to ``output``.
    ``total``: how many documents ``texts`` holds, where known (the progress bar's end)."""
    ids: list[int] = []
    docs = 0
    iterator = texts
    if progress:
        from tqdm import tqdm

        iterator = tqdm(texts, desc="tokenizing", unit="doc", total=total)
    for text in iterator:
        document = tokenizer.encode(text, add_special_tokens=False)
        if document:  # an empty file is no document (it was counted as one, its separator as a token)
            ids.extend(document)
            ids.append(SEPARATOR)
            docs += 1
    if not ids:
        raise SpecdecError("the corpus is empty: nothing to index")
    return write_datastore(ids, output, tokenizer.fingerprint(), tokenizer.vocab_size, docs, window)


def write_datastore(ids: list[int], output: Path, fingerprint: str, vocab_size: int, docs: int = 1, window: int = 16) -> dict:
    """Write token ids (documents separated by ``SEPARATOR``) as a datastore."""
    if not 1 <= window <= MAX_WINDOW:  # the sort reads tokens × window keys: a window of 10^8 took 23 GB and the OOM killer
        raise SpecdecError(f"the datastore window must be 1..{MAX_WINDOW} tokens (the drafter matches 12 at most), got {window}")
    tokens = np.asarray(ids, dtype=np.int32)
    padded = np.concatenate([tokens, np.full(window, SEPARATOR, dtype=np.int32)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, window)[: len(tokens)]
    order = np.lexsort(windows.T[::-1]).astype(np.int64)  # sort suffixes by their first `window` tokens
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    np.save(output / "tokens.npy", tokens)
    np.save(output / "suffix_array.npy", order)
    meta = {"format": FORMAT_VERSION, "window": window, "tokens": int(np.count_nonzero(tokens != SEPARATOR)), "documents": docs,
            "tokenizer_fingerprint": fingerprint, "vocab_size": vocab_size}
    (output / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


class Datastore:
    def __init__(self, path: Path) -> None:
        path = Path(path)
        meta_file = path / "meta.json"
        if path.is_file():
            raise SpecdecError(f"--datastore {path} is a file: give the datastore's folder (the one `specdec datastore build "
                               "--output` wrote)")
        if not meta_file.is_file():
            raise SpecdecError(f"{path} is not a datastore (no meta.json); build one with `specdec datastore build`")
        try:
            self.meta = json.loads(meta_file.read_text())
            self.tokens = np.load(path / "tokens.npy", mmap_mode="r")
            self.suffix_array = np.load(path / "suffix_array.npy", mmap_mode="r")
            self.window = int(self.meta["window"])
        except (OSError, ValueError, EOFError, KeyError, TypeError) as exc:  # (an emptied .npy: EOFError; {}: KeyError)
            raise SpecdecError(f"datastore {path} is corrupt ({type(exc).__name__}: {exc}); build it again") from exc
        if self.tokens.ndim != 1 or self.suffix_array.shape != self.tokens.shape:
            raise SpecdecError(f"datastore {path} is corrupt: {self.suffix_array.shape[0] if self.suffix_array.ndim else 0} "
                               f"suffix-array entries for {self.tokens.shape[0] if self.tokens.ndim else 0} tokens; build it again")

    def check_tokenizer(self, tokenizer) -> None:  # noqa: ANN001
        if self.meta.get("tokenizer_fingerprint") != tokenizer.fingerprint():
            raise SpecdecError(
                "this datastore was built with a different tokenizer than the target model's; "
                "rebuild it with `specdec datastore build --tokenizer <the target model>`"
            )

    def _compare(self, start: int, pattern: np.ndarray) -> int:
        """-1 / 0 / 1: the suffix at ``start`` vs ``pattern`` on the pattern's length."""
        piece = np.asarray(self.tokens[start : start + len(pattern)])
        if len(piece) < len(pattern):
            piece = np.concatenate([piece, np.full(len(pattern) - len(piece), SEPARATOR, dtype=np.int32)])
        diff = np.nonzero(piece != pattern)[0]
        if diff.size == 0:
            return 0
        return -1 if piece[diff[0]] < pattern[diff[0]] else 1

    def match_range(self, pattern: list[int]) -> tuple[int, int]:
        """Half-open range of suffix-array rows whose suffix starts with ``pattern``."""
        target = np.asarray(pattern, dtype=np.int32)
        lo, hi = 0, len(self.suffix_array)
        while lo < hi:  # first row >= pattern
            mid = (lo + hi) // 2
            if self._compare(int(self.suffix_array[mid]), target) < 0:
                lo = mid + 1
            else:
                hi = mid
        first, hi = lo, len(self.suffix_array)
        while lo < hi:  # first row > pattern
            mid = (lo + hi) // 2
            if self._compare(int(self.suffix_array[mid]), target) <= 0:
                lo = mid + 1
            else:
                hi = mid
        return first, lo


class RetrievalDrafter(Drafter):
    name = "retrieval"

    def __init__(self, datastore: Datastore, max_match: int = 12, min_match: int = 2, max_candidates: int = 256) -> None:
        self.datastore = datastore
        self.max_match = min(max_match, datastore.window)
        self.min_match = min_match
        self.max_candidates = max_candidates

    def propose(self, context_ids: list[int], k: int) -> Draft:
        store = self.datastore
        for length in range(min(self.max_match, len(context_ids)), self.min_match - 1, -1):
            first, end = store.match_range(context_ids[-length:])
            if first == end:
                continue
            starts = [int(store.suffix_array[i]) + length for i in range(first, min(end, first + self.max_candidates))]
            proposal: list[int] = []
            for offset in range(k):  # greedy walk down the most frequent continuation
                counts = Counter(int(store.tokens[s + offset]) for s in starts if s + offset < len(store.tokens))
                counts.pop(SEPARATOR, None)
                if not counts:
                    break
                token, _ = counts.most_common(1)[0]
                proposal.append(token)
                starts = [s for s in starts if s + offset < len(store.tokens) and int(store.tokens[s + offset]) == token]
            return Draft(tokens=proposal)
        return Draft(tokens=[])


_OPEN: dict[str, Datastore] = {}


def make_retrieval_drafter(res: DrafterResources) -> RetrievalDrafter:
    spec, tokenizer = res.spec, res.tokenizer
    if not spec.datastore:
        raise SpecdecError("method 'retrieval' needs a datastore (--datastore PATH, SpecConfig.datastore; built with `specdec datastore build`)")
    key = str(Path(spec.datastore).resolve())
    if key not in _OPEN:
        _OPEN[key] = Datastore(Path(spec.datastore))
    if tokenizer is not None:
        _OPEN[key].check_tokenizer(tokenizer)
    return RetrievalDrafter(_OPEN[key])


METHODS = (MethodInfo("retrieval", make_retrieval_drafter, "REST: continuations of the context's longest match in a datastore",
                      options=("num_speculative_tokens", "datastore"), requires=("datastore",)),)
