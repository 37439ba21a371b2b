"""Can this draft model speculate for this target without breaking exactness?

Verification compares token *ids*: if the draft's id 1234 means a different string than the target's,
every proposal is garbage and, worse, a "compatible-looking" pair silently loses speed. We therefore
compare the vocabularies string by string, the special ids, and the context window, and name the
first difference. There is deliberately no override flag.
"""

from __future__ import annotations

import logging
from pathlib import Path

from specdec.errors import ContextLengthError, IncompatibleModelsError

log = logging.getLogger(__name__)
#: (target, draft) names already warned about a draft no smaller than its target (check_pair runs per request)
_WARNED_SIZES: set[tuple[str, str]] = set()


def check_pair(target, draft) -> list[str]:  # noqa: ANN001 - specdec.api.LoadedModel
    """Raise :class:`IncompatibleModelsError` on a mismatch; return warnings for harmless differences."""
    warnings: list[str] = []
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    check_tokenizers(t_tok, d_tok, target.name, draft.name)
    # Embedding rows beyond the tokenizer are padding; a draft must not propose ids the target lacks.
    t_rows, d_rows = target.backend.config.vocab_size, draft.backend.config.vocab_size
    if d_rows > t_rows:
        raise IncompatibleModelsError(
            f"draft embedding has {d_rows} rows but the target only {t_rows}: the draft could propose ids the target cannot score"
        )
    if t_tok.chat_template != d_tok.chat_template:
        # Prompts are rendered with the target's template only; the draft sees the same ids.
        warnings.append("draft and target chat templates differ; the target's template is used for both")
    for message in warnings:
        log.info(message)
    draft_bytes, target_bytes = draft.backend.weight_bytes, target.backend.weight_bytes
    if draft_bytes >= target_bytes and (target.name, draft.name) not in _WARNED_SIZES:  # exact, but it cannot pay
        _WARNED_SIZES.add((target.name, draft.name))
        log.warning("the draft model %s reads %.2f GB per step, the target %s %.2f GB: a draft step costs as much as "
                    "the target's, so speculation cannot be faster than plain decoding (choose a smaller draft)",
                    draft.name, draft_bytes / 1e9, target.name, target_bytes / 1e9)
    return warnings


def check_tokenizers(t_tok, d_tok, target_name: str, draft_name: str) -> None:  # noqa: ANN001 - specdec.tokenizer.Tokenizer
    """The tokenizer half of :func:`check_pair` — the vocabularies string by string, the special ids, the stop
    tokens — which needs no weights (``specdec export`` checks a pair with it before writing it out)."""
    t_vocab, d_vocab = t_tok.tokens(), d_tok.tokens()
    # the same digest is the same vocabulary: a pair checked at load is not walked again per request
    same_vocab = t_tok.fingerprint() == d_tok.fingerprint() and len(t_vocab) == len(d_vocab)
    for index, (t_str, d_str) in enumerate(zip(t_vocab, d_vocab) if not same_vocab else ()):
        if t_str != d_str:
            raise IncompatibleModelsError(
                f"draft model {draft_name!r} has a different vocabulary from target {target_name!r}: "
                f"token id {index} is {t_str!r} in the target but {d_str!r} in the draft"
            )
    if len(t_vocab) != len(d_vocab):
        raise IncompatibleModelsError(
            f"draft model {draft_name!r} has {len(d_vocab)} tokens, target {target_name!r} has {len(t_vocab)}; "
            f"first token only one side has: id {min(len(t_vocab), len(d_vocab))}"
        )
    for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
        t_val, d_val = getattr(t_tok, field), getattr(d_tok, field)
        if t_val != d_val:
            raise IncompatibleModelsError(f"draft and target disagree on {field}: target {t_val}, draft {d_val}")
    if t_tok.stop_token_ids != d_tok.stop_token_ids:
        raise IncompatibleModelsError(
            f"draft and target stop on different tokens: target {sorted(t_tok.stop_token_ids)}, "
            f"draft {sorted(d_tok.stop_token_ids)}"
        )


#: the files of an HF directory that make its tokenizer: a draft whose copies are byte-identical pairs by construction
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


#: (target, draft) paths check_pair_files passed in this process
_CHECKED_FILES: set[tuple[Path, Path]] = set()


def check_pair_files(target_path: Path, draft_path: Path, target_name: str, draft_name: str) -> None:
    """:func:`check_pair`'s mismatches found from the files, before any weights load: a draft of another family
    was refused only after both models had loaded (~20 s for the built-in pair). Byte-identical tokenizer files
    skip the tokenizer walk (the built-in pairs: no cost); a GGUF's tokenizer is left to the check after loading
    (converting it is the slow part). :func:`check_pair` still runs on the loaded pair."""
    from specdec.models.weights import read_config
    from specdec.tokenizer import Tokenizer

    target_path, draft_path = Path(target_path), Path(draft_path)
    if (target_path, draft_path) in _CHECKED_FILES:  # bench asks twice (its own check, then the modes' plan)
        return
    t_rows, d_rows = read_config(target_path).vocab_size, read_config(draft_path).vocab_size
    if d_rows > t_rows:
        raise IncompatibleModelsError(
            f"draft embedding has {d_rows} rows but the target only {t_rows}: the draft could propose ids the target cannot score"
        )
    if not (target_path.is_dir() and draft_path.is_dir()):
        return
    if not all(_file_bytes(target_path / name) == _file_bytes(draft_path / name) for name in TOKENIZER_FILES):
        check_tokenizers(Tokenizer.load(target_path), Tokenizer.load(draft_path), target_name, draft_name)
    _CHECKED_FILES.add((target_path, draft_path))


def _file_bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def check_draft_context(draft, needed_len: int) -> None:  # noqa: ANN001
    limit = draft.backend.config.max_position_embeddings
    if needed_len > limit:
        raise ContextLengthError(
            f"the request needs {needed_len} positions but draft model {draft.name!r} supports {limit}"
        )
