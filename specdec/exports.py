"""Carry a speculative configuration to the engine a user scales on: vLLM, SGLang or llama.cpp.

The same choice — method, draft model, γ — written in each engine's own terms (flag names checked
against their sources, 2026-12): vLLM's ``--speculative-config`` JSON (``method``, ``model``,
``num_speculative_tokens``, ``prompt_lookup_min/max``; vllm/config/speculative.py), SGLang's
``--speculative-*`` flags (``STANDALONE`` for a draft model, ``NGRAM``; its n-gram match flags were renamed
between releases — ``--speculative-ngram-min/max-match-window-size`` became ``--speculative-ngram-max-trie-depth``
— so none is written), llama-server's ``-md`` / ``--spec-type`` / ``--spec-draft-n-max`` /
``--spec-draft-n-min`` / ``--spec-draft-p-min`` (the names since ggml-org/llama.cpp#22397, April 2026:
newer builds refuse the older ``--draft-max`` / ``--draft-min``; ``--spec-type draft-simple`` is written
because some builds load a draft model and never draft without it). Where an engine lacks our method, or
a setting of ours, the export says so and writes its nearest equivalent, never silently something else.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

from specdec.config import DEFAULT_DRAFT_METHOD, SpecConfig
from specdec.errors import SpecdecError

ENGINES = ("vllm", "sglang", "llamacpp")
#: each engine as its users write it
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"}
#: a fixed γ for engines that take no "auto": specdec adapts γ per round; these take one number
FIXED_GAMMA_FOR_AUTO = 4


@dataclass
class Export:
    """A command line for the engine and what the user must know about it."""

    engine: str
    command: list[str]
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        name = ENGINE_NAMES[self.engine]
        lines = [f"# {name}: the speculative configuration given to specdec, in {name}'s terms"]
        lines += [f"# note: {note}" for note in self.notes]
        lines.append(shlex.join(self.command))
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ModelRef:
    """How each engine names a model: vLLM / SGLang load a Hugging Face repository (or directory),
    llama.cpp a GGUF file."""

    hf: str  # repository id or local directory
    gguf: str  # a .gguf path, or "" when there is none


def model_ref(name_or_path: str) -> ModelRef:
    """A built-in name → its upstream repository and the GGUF specdec pulled; a path is kept as is."""
    from specdec.models.registry import BUILTIN_MODELS, model_file

    if name_or_path in BUILTIN_MODELS:
        builtin = BUILTIN_MODELS[name_or_path]
        return ModelRef(builtin.upstream or name_or_path, str(model_file(name_or_path)))
    path = Path(name_or_path).expanduser()
    return ModelRef(str(path), str(path) if path.suffix == ".gguf" else "")


def export(engine: str, model: str, spec: SpecConfig, draft_model: str | None = None) -> Export:
    """``spec`` (what ``specdec generate`` / ``serve`` ran with ``model`` and ``draft_model``) for ``engine``."""
    if engine not in ENGINES:
        raise SpecdecError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    from specdec.drafters.registry import resolve_method

    method = resolve_method(spec.method) or (DEFAULT_DRAFT_METHOD if draft_model else None)  # mtp → medusa
    if method is None:
        raise SpecdecError("nothing to export: give a speculative method (--method, or --draft-model)")
    if method in ("draft_model", "draft_suffix") and not draft_model:
        raise SpecdecError(f"method {method!r} needs --draft-model to export")
    notes: list[str] = []
    if draft_model and method not in ("draft_model", "draft_suffix"):
        notes.append(f"{method} drafts without a draft model: --draft-model {draft_model} is not exported")
        draft_model = None
    # specdec cuts a round at an unsure draft token only at γ=auto (SpecConfig.adaptive): at a fixed γ it drafts all
    cut = spec.draft_confidence_threshold if spec.adaptive else 0.0
    gamma = spec.num_speculative_tokens
    if gamma == "auto" and not (engine == "vllm" and method == "suffix"):  # vLLM's suffix decoding sizes its own drafts
        gamma = FIXED_GAMMA_FOR_AUTO
        notes.append(f"specdec chose γ per round (auto); {ENGINE_NAMES[engine]} takes one number: {gamma} (try 3-6 on your traffic)")
    if method in ("draft_model", "draft_suffix") and engine != "llamacpp" and cut > 0:
        notes.append(f"{ENGINE_NAMES[engine]} drafts all γ tokens every round: specdec's --draft-confidence-threshold "
                     f"{cut:g} (end a round at an unsure draft token) has no counterpart there")
    if method == "draft_suffix":
        notes.append(f"{ENGINE_NAMES[engine]} has no draft-model + suffix-table hybrid: exported as its draft-model method")
        method = "draft_model"
    target = model_ref(model)
    draft = model_ref(draft_model) if draft_model else None
    build = {"vllm": _vllm, "sglang": _sglang, "llamacpp": _llamacpp}[engine]
    return build(method, target, draft, None if gamma == "auto" else int(gamma), replace(spec, draft_confidence_threshold=cut), notes)


def unexported(method: str, engine: str) -> str:
    """Why ``method`` is not exported as itself."""
    if method in ("eagle", "medusa"):  # vLLM and SGLang serve such heads, in their own checkpoints' formats
        own = {"vLLM": "method 'mtp'", "SGLang": "NEXTN", "llama.cpp": "draft-mtp"}[engine]
        mtp = f" ({engine}'s {own} runs a checkpoint's built-in prediction layers, which Qwen2.5 has none of)" if method == "medusa" else ""
        return f"specdec's trained {method} heads are not in {engine}'s checkpoint format{mtp}"
    return f"{engine} has no {method!r} method"


def _vllm(method: str, target: ModelRef, draft: ModelRef | None, gamma: int | None, spec: SpecConfig, notes: list[str]) -> Export:
    """``gamma`` None: left to vLLM (only its suffix decoding, which adapts each draft's length up to 24)."""
    config: dict[str, object] = {} if gamma is None else {"num_speculative_tokens": gamma}
    if method == "draft_model":
        assert draft is not None
        config.update(method="draft_model", model=draft.hf)
    elif method == "ngram":
        config.update(method="ngram", prompt_lookup_min=spec.prompt_lookup_min, prompt_lookup_max=spec.prompt_lookup_max)
    elif method == "suffix":
        config.update(method="suffix")
        notes.append("vLLM's suffix decoding needs `pip install arctic-inference`")
        if gamma is None:
            notes.append("specdec chose γ per round (auto); vLLM's suffix decoding sizes each draft itself "
                         "(up to suffix_decoding_max_tree_depth, 24): num_speculative_tokens left out")
    else:
        config.update(method="ngram", prompt_lookup_min=spec.prompt_lookup_min, prompt_lookup_max=spec.prompt_lookup_max)
        notes.append(f"{unexported(method, 'vLLM')}: exported its draft-free n-gram method instead")
    return Export("vllm", ["vllm", "serve", target.hf, "--speculative-config", json.dumps(config)], notes)


def _sglang(method: str, target: ModelRef, draft: ModelRef | None, gamma: int, spec: SpecConfig, notes: list[str]) -> Export:
    """NGRAM stands in for every draft-free method: a trie of every request's tokens (as specdec's suffix
    method keeps), drafting a *tree* of γ + 1 tokens (up to --speculative-ngram-max-bfs-breadth wide)."""
    command = ["python", "-m", "sglang.launch_server", "--model-path", target.hf]
    if method == "draft_model":
        assert draft is not None
        # a chain of γ drafted tokens: top-k 1, and the verified tokens count the root as well
        command += ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", draft.hf,
                    "--speculative-num-steps", str(gamma), "--speculative-eagle-topk", "1",
                    "--speculative-num-draft-tokens", str(gamma + 1)]
    else:
        if method != "ngram":
            notes.append(f"{unexported(method, 'SGLang')}: exported its n-gram method (NGRAM) instead")
        lookup = (f"; prompt_lookup_min/max ({spec.prompt_lookup_min}/{spec.prompt_lookup_max}) have no counterpart"
                  if method == "ngram" else "")
        notes.append(f"SGLang's NGRAM matches up to --speculative-ngram-max-trie-depth tokens (18) in a trie shared by all "
                     f"requests and drafts a tree of {gamma + 1} tokens (the last verified one counted), not specdec's "
                     f"chain{lookup}. Older SGLang releases run NGRAM on CUDA only")
        command += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(gamma + 1)]
    return Export("sglang", command, notes)


def _llamacpp(method: str, target: ModelRef, draft: ModelRef | None, gamma: int, spec: SpecConfig, notes: list[str]) -> Export:
    if not target.gguf:
        raise SpecdecError("llama.cpp loads GGUF files: give the target as a built-in name or a .gguf path")
    command = ["llama-server", "-m", target.gguf]
    if method == "draft_model":
        assert draft is not None
        if not draft.gguf:
            raise SpecdecError("llama.cpp loads GGUF files: give the draft model as a built-in name or a .gguf path")
        command += ["-md", draft.gguf, "--spec-type", "draft-simple", "--spec-draft-n-max", str(gamma),
                    "--spec-draft-n-min", "0", "--spec-draft-p-min", f"{spec.draft_confidence_threshold:g}"]
        notes.append(("--spec-draft-p-min ends a round when the draft's top probability falls below it, as specdec's "
                      "--draft-confidence-threshold does at γ=auto" if spec.draft_confidence_threshold > 0 else
                      "--spec-draft-p-min 0: every round drafts all γ tokens, as specdec does without a confidence cut")
                     + " (llama.cpp builds before April 2026, ggml-org/llama.cpp#22397, spelled these --draft-max, "
                       "--draft-min, --draft-p-min and had no --spec-type)")
    else:
        if method != "ngram":
            nearer = " (its ngram-mod, one pool shared by all slots, is nearer suffix decoding)" if method == "suffix" else ""
            notes.append(f"{unexported(method, 'llama.cpp')}: exported its n-gram method (ngram-simple) instead{nearer}")
        # lookup n-gram of prompt_lookup_max tokens, drafts of γ tokens
        elif spec.prompt_lookup_min != spec.prompt_lookup_max:
            notes.append(f"llama.cpp's ngram-simple matches exactly --spec-ngram-simple-size-n tokens: "
                         f"prompt_lookup_max {spec.prompt_lookup_max} is written, prompt_lookup_min "
                         f"{spec.prompt_lookup_min} (shorter matches) has no counterpart")
        command += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(spec.prompt_lookup_max),
                    "--spec-ngram-simple-size-m", str(gamma)]
    return Export("llamacpp", command, notes)
