"""Tokenizer: encode/decode, special ids, chat templates, and streaming detokenization.

Built on transformers' fast tokenizers (and its GGUF tokenizer converter) rather than our own BPE.
Converting a GGUF vocabulary takes seconds, so the converted tokenizer is saved beside the GGUF
(``<stem>.tokenizer/``) and loaded from there next time.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Sequence

from specdec.errors import SpecdecError, WeightsError

#: End-of-sequence / end-of-turn tokens across families. Every one present in a vocabulary as a
#: special token stops generation: Qwen GGUFs declare EOS <|im_end|> but plain completions end
#: with <|endoftext|>, and a decoder that only watches the declared EOS runs on past the end.
END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "</s>", "<|eom_id|>", "<eos>")


def _tokenizer_cache_dir(gguf_path: Path) -> Path:
    beside = gguf_path.parent / f"{gguf_path.stem}.tokenizer"
    if os.access(gguf_path.parent, os.W_OK):
        return beside
    stat = gguf_path.stat()
    key = hashlib.sha1(f"{gguf_path.resolve()}:{stat.st_size}".encode()).hexdigest()[:16]
    home = Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec")
    return home / "tokenizers" / key


class Tokenizer:
    """A thin, typed wrapper over a transformers fast tokenizer (``.hf``)."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.chat_template: str | None = getattr(hf, "chat_template", None)
        self.bos_token_id: int | None = hf.bos_token_id
        self.eos_token_id: int | None = hf.eos_token_id
        self.pad_token_id: int | None = hf.pad_token_id
        self.vocab_size: int = len(hf)
        special = set(hf.all_special_tokens) | {t.content for t in hf.added_tokens_decoder.values() if t.special}
        stops = {self.eos_token_id} if self.eos_token_id is not None else set()
        for token in END_TOKENS:
            if token in special:
                token_id = hf.convert_tokens_to_ids(token)
                if isinstance(token_id, int) and token_id >= 0:
                    stops.add(token_id)
        self.stop_token_ids: frozenset[int] = frozenset(stops)

    # --- loading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        path = Path(path)
        if path.is_file() and path.suffix == ".gguf":
            return cls.from_gguf(path)
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return cls.from_hf_dir(path)
        raise WeightsError(f"no tokenizer found at {path}: expected a .gguf file or a directory with tokenizer.json")

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> "Tokenizer":
        from transformers import AutoTokenizer

        try:
            return cls(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
        except (OSError, ValueError) as exc:
            raise WeightsError(f"cannot load the tokenizer in {path}: {exc}") from exc

    @classmethod
    def from_gguf(cls, path: str | Path) -> "Tokenizer":
        from transformers import AutoTokenizer

        path = Path(path)
        cache = _tokenizer_cache_dir(path)
        if (cache / "tokenizer.json").is_file():
            try:
                return cls(AutoTokenizer.from_pretrained(str(cache), local_files_only=True))
            except (OSError, ValueError):
                pass  # stale or broken cache: convert again
        try:
            hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        except Exception as exc:  # the converter raises many types on a bad vocabulary
            raise WeightsError(f"cannot read the tokenizer from {path}: {exc}") from exc
        try:
            hf.save_pretrained(str(cache))
        except OSError:
            pass  # read-only location: only costs the next start a conversion
        return cls(hf)

    # --- text <-> ids --------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise SpecdecError("this model has no chat template; pass a plain prompt (without --chat)")
        for message in messages:
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise SpecdecError("each chat message needs 'role' and 'content'")
        return self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        # the template already contains every special token: do not let encode() add a BOS again
        return self.encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)

    def tokens(self) -> list[str]:
        """Token string of every id (to check that two tokenizers agree id by id)."""
        return self.hf.convert_ids_to_tokens(list(range(self.vocab_size)))

    def token_to_id(self, token: str) -> int | None:
        token_id = self.hf.convert_tokens_to_ids(token)
        return token_id if isinstance(token_id, int) and token_id != self.hf.unk_token_id else None


class IncrementalDetokenizer:
    """Streams text for generated ids without splitting a UTF-8 character and without re-decoding
    the whole output each step: only a small window of recent ids is decoded (vLLM/TGI style)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the window decoded for context
        self.read_offset = 0  # ids before this are already emitted as text
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            new_text = full_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += new_text
            return new_text
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        new_text = full_text[len(prefix_text) :]
        self.read_offset = len(self.ids)
        self.prefix_offset = self.read_offset
        self.text += new_text
        return new_text
