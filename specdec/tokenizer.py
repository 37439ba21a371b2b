"""Tokenizer: encode/decode, special ids, chat templates, and streaming detokenization.

Built on transformers' fast tokenizers and its GGUF tokenizer converter rather than a BPE of our
own. Converting a GGUF vocabulary takes seconds (~20 s for Qwen's 151k tokens on 2 cores), so the
converted tokenizer is saved beside the GGUF (``<stem>.tokenizer/``) and loaded from there next time.

The cache is always loaded with transformers' *generic* fast-tokenizer class, and so is the first,
freshly converted copy (we reload what we just saved). A model-specific class would rebuild its own
pipeline from the vocabulary: ``Qwen2Tokenizer`` adds an NFC normalizer the GGUF conversion (and
llama.cpp) do not have, so "café" written with a combining accent would tokenize one way on the
first start and another way on the next. Speculative decoding compares token ids, so a tokenizer
must be the same object on every start.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from specdec.errors import SpecdecError, TemplateArgumentError, WeightsError

#: End-of-sequence / end-of-turn tokens across families. Every one present in a vocabulary as a
#: special token stops generation: Qwen GGUFs declare EOS <|im_end|> but plain completions end
#: with <|endoftext|>, and a decoder that only watches the declared EOS runs on past the end.
END_TOKENS = (
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "<end_of_turn>",
    "<|end|>", "</s>", "<eos>", "<|eot|>", "<|return|>",
)
_STAMP = "specdec-source.json"  # in the cache dir: which GGUF (size, mtime) and converter made it
_STAMP_FORMAT = 1


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _source_stamp(gguf_path: Path) -> dict[str, Any]:
    import transformers

    stat = gguf_path.stat()
    return {"format": _STAMP_FORMAT, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "transformers": transformers.__version__}


def tokenizer_cache_dir(gguf_path: Path) -> Path:
    """Beside the GGUF if that folder is writable, else under ``$SPECDEC_HOME/tokenizers/``."""
    gguf_path = Path(gguf_path)
    if os.access(gguf_path.parent, os.W_OK):
        return gguf_path.parent / f"{gguf_path.stem}.tokenizer"
    from specdec.paths import specdec_home

    key = hashlib.sha1(f"{gguf_path.resolve()}:{gguf_path.stat().st_size}".encode()).hexdigest()[:16]
    return specdec_home() / "tokenizers" / key


def _load_generic(directory: Path) -> Any:
    """Load a saved fast tokenizer exactly as its tokenizer.json describes it (see the module doc)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)


def _save_atomically(hf: Any, cache: Path, stamp: dict[str, Any]) -> None:
    """Write into a temporary sibling and rename, so a concurrent start never reads half a cache."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", dir=cache.parent))
    try:
        hf.save_pretrained(str(tmp))
        (tmp / _STAMP).write_text(json.dumps(stamp))
        shutil.rmtree(cache, ignore_errors=True)  # stale copy, if any
        os.replace(tmp, cache)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (cache / _STAMP).is_file():  # not a concurrent writer winning the race
            raise


def _read_stamp(cache: Path) -> dict[str, Any] | None:
    try:
        return json.loads((cache / _STAMP).read_text())
    except (OSError, ValueError):
        return None


#: the roles a chat message may have (OpenAI's; the server's schema reads the same)
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def text_content(parts: list[Any], index: int) -> str:
    """OpenAI's list form of a message's content (``[{"type": "text", "text": ...}, ...]``) as the text the chat
    template reads — the server took it and the library passed the list to templates that concatenate strings.
    A part that is not text (an image, audio) is refused by name: nothing here would read it."""
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise SpecdecError(f"chat message {index}: a content part of type {kind!r}; text parts only (no images or audio)")
        texts.append(part["text"])
    return "".join(texts)


#: what :meth:`Tokenizer.render_chat` passes the template itself: a request's chat_template_kwargs may not set them
RENDER_ARGUMENTS = ("messages", "conversation", "chat_template", "add_generation_prompt", "tokenize", "tools",
                    "continue_final_message", "documents", "return_dict", "tokenizer_kwargs")


class Tokenizer:
    """A thin, typed wrapper over a transformers fast tokenizer (public as ``.hf``)."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        # the context window is checked where it is known (engine.check_context, the server's 400): transformers' own
        # check warned "…longer than the specified maximum… will result in indexing errors" on every long prompt,
        # refused or not (its limit is the tokenizer file's, not the model's)
        hf.model_max_length = int(1e30)
        self.chat_template: str | None = getattr(hf, "chat_template", None) or None
        self.bos_token_id: int | None = hf.bos_token_id
        self.eos_token_id: int | None = hf.eos_token_id
        self.pad_token_id: int | None = hf.pad_token_id
        self.vocab_size: int = len(hf)
        self.stop_token_ids: frozenset[int] = self._stop_ids()

    def _stop_ids(self) -> frozenset[int]:
        special = set(self.hf.all_special_tokens) | {t.content for t in self.hf.added_tokens_decoder.values() if t.special}
        stops = {self.eos_token_id} if self.eos_token_id is not None else set()
        stops |= {i for token in END_TOKENS if token in special and (i := self.token_to_id(token)) is not None}
        return frozenset(stops)

    # --- loading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """A ``.gguf`` file, or a directory with ``tokenizer.json``."""
        path = Path(path)
        if path.is_file() and path.suffix == ".gguf":
            return cls.from_gguf(path)
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return cls.from_hf_dir(path)
        raise WeightsError(f"no tokenizer found at {path}: expected a .gguf file or a directory with tokenizer.json")

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> "Tokenizer":
        """A Hugging Face tokenizer directory, read as transformers reads it (never from the network)."""
        from transformers import AutoTokenizer

        if not Path(path).is_dir():
            raise WeightsError(f"tokenizer directory {path} does not exist")
        try:
            return cls(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise WeightsError(f"cannot load the tokenizer in {path}: {_one_line(exc)}") from exc

    @classmethod
    def from_gguf(cls, path: str | Path) -> "Tokenizer":
        """The tokenizer stored in a GGUF's metadata, converted once and cached (see the module doc)."""
        path = Path(path)
        if not path.is_file():
            raise WeightsError(f"GGUF file {path} does not exist")
        stamp = _source_stamp(path)
        cache = tokenizer_cache_dir(path)
        if _read_stamp(cache) == stamp:
            try:
                return cls(_load_generic(cache))
            except (OSError, ValueError, KeyError, TypeError):
                pass  # broken cache: convert again
        hf = cls._convert_gguf(path)
        try:
            _save_atomically(hf, cache, stamp)
            return cls(_load_generic(cache))
        except OSError:  # nowhere to write: use it in memory, via the same generic class
            with tempfile.TemporaryDirectory() as tmp:
                hf.save_pretrained(tmp)
                return cls(_load_generic(Path(tmp)))

    @staticmethod
    def _convert_gguf(path: Path) -> Any:
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        except Exception as exc:  # the converter raises many types on a bad or foreign file
            raise WeightsError(f"cannot read the tokenizer from {path}: {_one_line(exc)}") from exc
        if not getattr(hf, "chat_template", None):  # transformers reads it today; older versions did not
            hf.chat_template = _gguf_chat_template(path)
        return hf

    # --- text <-> ids --------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Special-token strings in ``text`` (e.g. ``<|im_start|>``) become their ids. Text that is not
        Unicode (see :func:`not_unicode`) is a :class:`SpecdecError`, not the tokenizer's TypeError."""
        try:
            return list(self.hf.encode(text, add_special_tokens=add_special_tokens))
        except TypeError:
            reason = not_unicode(text)
            if reason is None:
                raise
            raise SpecdecError(reason) from None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None, continue_final_message: bool = False,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt text the model's own chat template produces for ``messages`` (and ``tools``:
        OpenAI-shaped function tools, which templates that know tools describe to the model);
        ``continue_final_message``: the last message left open, for the model to continue; ``template_kwargs``:
        further variables the template reads (vLLM's ``chat_template_kwargs``), never the ones named here."""
        reserved = sorted(set(template_kwargs or ()) & set(RENDER_ARGUMENTS))
        if reserved:
            raise TemplateArgumentError(f"chat_template_kwargs may not set {', '.join(reserved)} (a request field of its own, or ours)")
        if not self.chat_template:
            raise SpecdecError("this model has no chat template; pass a plain prompt (without --chat; the library: chat=False)")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise SpecdecError("each chat message needs 'role' and 'content'")
            if message["role"] not in CHAT_ROLES:  # a template renders any role it is given, as if it were plain text
                raise SpecdecError(f"chat message {index}: role {message['role']!r} is not one of {', '.join(CHAT_ROLES)}")
        messages = [{**message, "content": text_content(message["content"], index)} if isinstance(message["content"], list)
                    else message for index, message in enumerate(messages)]
        if "developer" not in self.chat_template:  # OpenAI's newer name for the system turn; such templates drop it
            messages = [{**message, "role": "system"} if message["role"] == "developer" else message for message in messages]
        try:
            return self.hf.apply_chat_template(
                messages, chat_template=self.chat_template, add_generation_prompt=add_generation_prompt, tokenize=False,
                tools=tools, continue_final_message=continue_final_message, **(template_kwargs or {}))
        except Exception as exc:  # jinja2 errors, including raise_exception() inside templates
            raise SpecdecError(f"the chat template rejected these messages: {_one_line(exc)}") from exc

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> list[int]:
        # the template already writes every special token: encode() must not add a BOS again
        return self.encode(self.render_chat(messages, add_generation_prompt, tools), add_special_tokens=False)

    def tokens(self) -> list[str]:
        """Token string of every id (to check that two tokenizers agree id by id). Built once: the
        pair check runs per request and 150k lookups cost ~0.15 s."""
        cached = self.__dict__.get("_tokens")
        if cached is None:
            cached = self.__dict__["_tokens"] = self.hf.convert_ids_to_tokens(list(range(self.vocab_size)))
        return cached

    def fingerprint(self) -> str:
        """A short digest of the vocabulary: two tokenizers with the same one share caches and
        datastores, and a draft pair checked once need not be compared string by string again. Built
        once: every suffix-drafting request asks (6 ms of hashing each, on the server's model thread)."""
        cached = self.__dict__.get("_fingerprint")
        if cached is None:
            cached = self.__dict__["_fingerprint"] = hashlib.sha256("\x00".join(self.tokens()).encode()).hexdigest()[:32]
        return cached

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for, for OpenAI's logprobs ``bytes`` (joined, they rebuild the text).
        Why not ``decode([id]).encode()``: where a character's bytes are split across tokens, a lone
        token decodes to U+FFFD and its own bytes are lost. Byte-level BPE vocabularies (GPT-2's, Qwen's)
        spell each byte as one character; SentencePiece ones spell a stray byte ``<0xAB>``; any other
        token (a special one, a SentencePiece word) is its decoded text."""
        table = self.__dict__.get("_byte_of_char")
        if table is None:
            byte_level = type(self.hf.backend_tokenizer.decoder).__name__ == "ByteLevel"
            table = self.__dict__["_byte_of_char"] = _byte_level_table() if byte_level else {}
        piece = self.tokens()[token_id] if 0 <= token_id < self.vocab_size else None
        text = self.decode([token_id])
        if piece is None or (text and "\ufffd" not in text):
            return text.encode()
        if table and all(char in table for char in piece):
            return bytes(table[char] for char in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return text.encode()

    def token_to_id(self, token: str) -> int | None:
        """Exact lookup; ``None`` if absent (never the unk id, which some vocabularies alias to a real token)."""
        return self.hf.backend_tokenizer.token_to_id(token)

    def fill_in_the_middle(self, prefix: str, suffix: str) -> list[int]:
        """The prompt that asks a code model for the text between ``prefix`` and ``suffix``: its FIM
        tokens in prefix-suffix-middle order (Qwen2.5-Coder's ``<|fim_prefix|>``…, StarCoder's
        ``<fim_prefix>``…); the answer ends with an end-of-text token. A model without them: an error."""
        for names in FIM_TOKENS:
            ids = [self.token_to_id(name) for name in names]
            if None not in ids:
                start, hole, middle = ids
                return ([start] + self.encode(prefix, add_special_tokens=False) + [hole]
                        + self.encode(suffix, add_special_tokens=False) + [middle])  # type: ignore[list-item]
        raise SpecdecError("this model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>): "
                           "a suffix cannot be given")


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the character that spells each byte → the byte (printable
    Latin-1 bytes spell themselves, the other 68 are shifted to U+0100 upwards)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(shifted)}}


#: fill-in-the-middle markers (prefix, suffix, middle) of the model families that have them
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))


def _gguf_chat_template(path: Path) -> str | None:
    import gguf

    field = gguf.GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    return bytes(field.parts[field.data[0]]).decode("utf-8") if field is not None else None


class IncrementalDetokenizer:
    """Streams text for generated ids without splitting a UTF-8 character and without re-decoding
    the whole output each step (vLLM/TGI style).

    Only a window of recent ids is decoded: ``ids[prefix_offset:read_offset]`` was already emitted
    and is decoded again as context, ``ids[read_offset:]`` is new. The new text is what decoding
    the window adds to decoding its context; it is held back while it ends in U+FFFD (a character
    whose bytes are split across tokens). Decoding with context matters for decoders that treat the
    start of a sequence specially (SentencePiece drops the leading space there). Guarantee:
    ``"".join(push(i) for i in ids) + flush() == tokenizer.decode(ids)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the context window
        self.read_offset = 0  # ids before this are already emitted as text
        self.text = ""  # everything emitted so far

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _pending(self) -> str:
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""

    def _emit(self, new_text: str) -> str:
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += new_text
        return new_text

    def push(self, token_id: int) -> str:
        """Add one id; return the text that became final ("" while a character is incomplete)."""
        self.ids.append(int(token_id))
        new_text = self._pending()
        if new_text and not new_text.endswith("\ufffd"):
            return self._emit(new_text)
        return ""

    def flush(self) -> str:
        """The text still held back at the end of the stream (U+FFFD for an incomplete character)."""
        return self._emit(self._pending())


def not_unicode(text: str) -> str | None:
    """Why ``text`` cannot be tokenized, where it holds a lone surrogate, else None. Python keeps the bytes
    of a command line or a pipe that are not UTF-8 as U+DC80..U+DCFF (surrogateescape: a Latin-1 "é" is
    byte 0xE9), and a JSON string can spell any surrogate as an escape; tokenizers take neither."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")  # in C: the first surrogate's index, without a Python loop over a long prompt
    except UnicodeEncodeError as exc:
        index = exc.start
    else:
        return None
    char = text[index]
    if "\udc80" <= char <= "\udcff":
        return (f"the text is not valid UTF-8: byte 0x{ord(char) - 0xDC00:02x} at character {index} "
                "(convert it to UTF-8, e.g. with iconv)")
    return f"the text holds an unpaired surrogate U+{ord(char):04X} at character {index}: it is not Unicode text"

