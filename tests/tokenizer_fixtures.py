"""A tiny, real byte-level BPE tokenizer trained in-process (no network), and its GGUF encoding.

The tokenizer is shaped like Qwen2's (the default model pair): byte-level BPE, Qwen2's split regex
(digits one by one), no normalizer, ``<|endoftext|>`` = id 0, ChatML specials, no BOS. Using the
same pre-tokenizer that transformers' GGUF converter builds for ``tokenizer.ggml.pre = "qwen2"``
means the HF-directory and the GGUF versions of it tokenize identically, which the tests check.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: Qwen2's pre-tokenizer split (transformers' ``qwen2`` PRETOKENIZE_REGEX, llama.cpp's ``qwen2`` pre).
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

_ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens and verifies them in one forward pass.",
    "A small draft model proposes, the large target model accepts or rejects.",
    "Lossless means the output distribution is exactly that of the target model.",
    "We don't guess; we check every token, and it's still faster when drafts are good.",
    "Hello, world! How are you today? I'm fine, thanks.",
]
_CODE = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "import numpy as np\nfor i in range(10):\n    print(i, i * i)\n",
    "class Stack:\n    def push(self, item):\n        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n",
    "if __name__ == \"__main__\":\n    main()\n",
    "    return {\"id\": 42, \"name\": 'value', \"items\": [1, 2, 3]}\n",
]
_OTHER = [
    "café naïve résumé façade Ångström",
    "你好世界，今天天气很好。",
    "🙂 👍 🚀 — “quotes” and ‘more’ … ±×÷",
    "Grüße aus München, señor; ça va?",
]


def corpus() -> list[str]:
    """A few hundred deterministic lines of English, code and non-ASCII text."""
    lines = list(_ENGLISH + _CODE + _OTHER)
    for i in range(60):
        lines.append(f"def func_{i}(x, y):\n    return x * {i} + y  # line {i}\n")
        lines.append(f"{_ENGLISH[i % len(_ENGLISH)]} Number {i * 7}: {_OTHER[i % len(_OTHER)]}")
        lines.append(f"for item in items[{i}:]:\n    total += item ** {i % 4}\n")
        lines.append(_CODE[i % len(_CODE)])
    return lines


def write_tiny_tokenizer(out_dir: Path, vocab_size: int = 400) -> Path:
    """Train and write ``tokenizer.json`` + ``tokenizer_config.json`` into ``out_dir`` (< 1 s, deterministic)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        # generic class: a model-specific one (Qwen2Tokenizer) would rebuild its own pipeline (adding NFC)
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "add_bos_token": False,
        "chat_template": CHATML,
        "model_max_length": 512,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return out_dir


def add_tokenizer_to_gguf(writer, tokenizer_dir: Path) -> None:  # noqa: ANN001 - gguf.GGUFWriter
    """Write the tokenizer in ``tokenizer_dir`` as llama.cpp's GGUF tokenizer metadata.

    Keys: ``tokenizer.ggml.{model,pre,tokens,token_type,merges,eos/padding_token_id,add_bos_token}``
    and ``tokenizer.chat_template``; no BOS id since the tokenizer has none. transformers' converter
    also needs ``general.architecture`` (the writer's arch: it picks the config, hence the tokenizer
    class) but no other model key and no tensor to build the tokenizer.
    """
    import gguf

    tokenizer_dir = Path(tokenizer_dir)
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    added = {t["content"]: t for t in spec.get("added_tokens", [])}
    vocab.update({content: t["id"] for content, t in added.items()})
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ValueError(f"{tokenizer_dir}: token ids are not contiguous")
    types = [
        (gguf.TokenType.CONTROL if added[t]["special"] else gguf.TokenType.USER_DEFINED) if t in added else gguf.TokenType.NORMAL
        for t in tokens
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_name(spec["pre_tokenizer"]))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id), ("pad_token", writer.add_pad_token_id)):
        if config.get(key) is not None:
            add(vocab[config[key]])
    writer.add_add_bos_token(bool(config.get("add_bos_token", False)))
    if config.get("chat_template"):
        writer.add_chat_template(config["chat_template"])


def _pre_name(pre_tokenizer: dict) -> str:
    """The ``tokenizer.ggml.pre`` for which transformers' converter rebuilds this exact pre-tokenizer."""
    steps = pre_tokenizer.get("pretokenizers", [pre_tokenizer])
    if len(steps) == 2 and steps[0]["type"] == "Split" and steps[0]["pattern"].get("Regex") == QWEN2_SPLIT:
        return "qwen2"
    if len(steps) == 1 and steps[0]["type"] == "ByteLevel" and steps[0].get("use_regex", True):
        return "gpt-2"  # no split entry: the converter keeps GPT2Tokenizer's ByteLevel(use_regex=True)
    raise ValueError(f"no GGUF pre-tokenizer name reproduces {pre_tokenizer}")
