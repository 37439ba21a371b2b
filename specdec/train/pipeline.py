"""``specdec train-drafter`` as a library call: data → target features → training → report.

Every stage resumes: feature shards already written are kept, and training continues from its
checkpoint (``resume=True``), so a long run can be cut and restarted with the same command.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from specdec.config import SpecConfig
from specdec.errors import SpecdecError
from specdec.models.head_files import WEIGHTS_FILE
from specdec.models.registry import DEFAULT_DRAFT
from specdec.train.data import add_minutes, extract_features, load_documents, load_shards, token_sequences
from specdec.train.feature_spec import parse_feature_layers
from specdec.train.generated import generate_sequences, generated_sequences, held_out_continuations, held_out_prompts
from specdec.train.loop import TrainConfig, describe, train_head
from specdec.train.precision import choose_precision
from specdec.train.target_parts import TargetParts, last_layer_weights
from specdec.train.vocab import coverage, frequency_ids

KINDS = ("eagle", "medusa", "distill")
#: the held-out curve's shards when training reads the target's continuations (features/<this>)
ON_POLICY_HELD_OUT = "held_out_generated"


@dataclass
class DrafterTraining:
    """What to train and on what (defaults: the CLI's)."""

    model: str
    out_dir: Path
    kind: str = "eagle"
    data: str = "stdlib"
    quantize: str = "auto"  # the target's execution while extracting features: the one it will run with
    seq_len: int = 256
    max_sequences: int = 0  # 0: as many as the extraction budget allows
    held_out_sequences: int = 32
    extract_minutes: float = 40.0
    #: self-distillation (specdec.train.generated): minutes of the target continuing prompts drawn from
    #: the data before extraction (0: none, but a resumed run still uses the continuations it has)
    generate_minutes: float = 0.0
    generate_tokens: int = 128  # new tokens per continuation
    generate_concurrency: int | None = None  # continuations in flight (one batched forward per step); None: auto
    draft_vocab_size: int = 32768
    draft_vocab: str = "frequency"  # eagle/medusa: which ids the head scores (first | frequency: specdec.train.vocab)
    intermediate_size: int = 0  # eagle: the head's MLP width (0: 2 × hidden)
    #: eagle: the head's decoder layer starts "random" (small weights) or as the target's last layer
    #: ("target": :func:`~specdec.train.target_parts.last_layer_weights`)
    head_init: str = "random"
    num_medusa_heads: int = 4  # medusa: K heads (tokens per round)
    #: eagle: which of the target's layers the head reads — "final" (EAGLE-1/2), "fused" (EAGLE-3: a low,
    #: a middle and the final one, :func:`~specdec.models.heads.fused_layers`) or ascending layer numbers
    #: "2,14,28" (the residual stream entering each; the last must be the final hidden state, num_layers)
    feature_layers: str = "final"
    draft_model: str = DEFAULT_DRAFT  # distill: the draft model to align
    trainable_layers: int = 2  # distill: the draft's last N layers (and final norm) train
    divergence: str = "kl"  # distill: kl | tvd | greedy
    resume: bool = False
    eval_prompts: int = 8
    eval_prompt_tokens: int = 128
    eval_new_tokens: int = 64
    gamma: int = 4
    skip_eval: bool = False
    train: TrainConfig = field(default_factory=TrainConfig)


#: the settings a run's saved features and checkpoint depend on (run.json). A --resume with one changed
#: damaged the run: --seq-len mixed shards of two shapes, --data skipped or repeated data (shards are
#: skipped by index), --kind extracted minutes of features before the checkpoint refused the head
RUN_IDENTITY = ("kind", "model", "data", "seq_len", "feature_layers", "quantize")
RUN_FILE = "run.json"


def check_run_identity(job: DrafterTraining, out: Path, log: Callable[[str], None]) -> None:
    """Refuse a ``--resume`` whose settings differ from the run in ``out`` (before any model loads, nothing
    written), say when there is nothing to resume, and record this run's settings."""
    if out.exists() and not out.is_dir():
        raise SpecdecError(f"--out {out}: is a file; give a folder for the trained drafter")
    saved_file = out / RUN_FILE
    model_files = [name for name in ("config.json", "model.safetensors", "tokenizer.json") if (out / name).exists()]
    if model_files and not saved_file.is_file():  # a model's own folder: the head's files would replace its weights
        raise SpecdecError(f"--out {out}: holds a model ({', '.join(model_files)}) and no training run; "
                           "give an empty or new folder for the trained drafter")
    identity = {name: str(getattr(job, name)) for name in RUN_IDENTITY} | {"seed": str(job.train.seed)}
    if job.kind == "distill":
        identity["draft_model"] = str(job.draft_model)
    # the saved features are reused by shard index with or without --resume (an extraction cut short has no
    # checkpoint yet): whenever there are some, they must be this run's
    if saved_file.is_file() and (job.resume or (out / "features").is_dir()):
        try:
            saved = json.loads(saved_file.read_text())
        except (ValueError, OSError):
            saved = None
        if not isinstance(saved, dict):
            raise SpecdecError(f"{saved_file}: not a run's settings (corrupt); delete {out} or choose another --out")
        changed = [f"--{key.replace('_', '-')} {saved[key]} (now {value})" for key, value in identity.items()
                   if key in saved and saved[key] != value]
        if changed:
            raise SpecdecError(f"{out} holds a run made with {', '.join(changed)}; run with the same settings to "
                               "continue it, or choose another --out")
    elif job.resume and not (out / "checkpoint.pt").is_file() and not (out / "features").is_dir():
        log(f"--resume: {out} holds no run yet: starting a new one")
    out.mkdir(parents=True, exist_ok=True)
    saved_file.write_text(json.dumps(identity, indent=1))


def target_mode(job: DrafterTraining) -> str:
    """The target's execution while extracting features: ``auto`` resolves to what ``--quantize auto``
    runs the target with *when speculating with this kind* (not plain decoding's choice: int4 here,
    while speculation verifies in int8), so the features are the ones the drafter will read."""
    if job.quantize != "auto" or torch.cuda.is_available():
        return job.quantize
    from specdec.api import plan_execution

    if job.kind == "distill":
        return plan_execution(job.model, job.draft_model, "draft_model").target_mode
    return plan_execution(job.model, None, job.kind).target_mode


def train_drafter(job: DrafterTraining, progress: bool = False, log: Callable[[str], None] = lambda _line: None) -> Path:
    """Run the whole job; returns the report's path (the head directory is ``job.out_dir``).
    ``progress``: tqdm bars on stderr; ``log(line)``: what each stage found (the CLI prints both)."""
    import specdec
    from specdec.cpu import cpu_description
    from specdec.models.heads import HeadConfig, new_head
    from specdec.train.report import measure_speculation, write_report

    if job.kind not in KINDS:
        raise SpecdecError(f"--kind {job.kind!r} is not available yet; available: {', '.join(KINDS)}")
    if job.kind == "distill":
        from specdec.train.distill import check_job

        check_job(job.model, job.draft_model, job.trainable_layers, job.divergence)
    out = Path(job.out_dir).expanduser()
    if (out / "checkpoint.pt").is_file() and not job.resume:
        raise SpecdecError(f"{out} already holds a training run: pass --resume to continue it, or choose another --out")
    docs = load_documents(job.data)  # a missing file fails here, before the run's folder or a model is touched
    check_run_identity(job, out, log)

    target = specdec.load_model(job.model, quantize=target_mode(job), progress=progress)
    log(f"target {target.name}: {target.backend.dtype_name}")
    layers = feature_layers(job.feature_layers, target.config.num_layers, job.kind)
    encode = target.tokenizer.encode
    held_out = token_sequences(docs, encode, job.seq_len, held_out=True, seed=job.train.seed)[: job.held_out_sequences]
    train = token_sequences(docs, encode, job.seq_len, held_out=False, seed=job.train.seed)
    if job.max_sequences:
        train = train[: job.max_sequences]
    if not train or not held_out:
        raise SpecdecError(f"the data {job.data!r} gives {len(train)} training and {len(held_out)} held-out sequences "
                           f"of up to {job.seq_len} tokens: give more text")
    log(f"data {job.data}: {len(docs)} documents, {len(train)} training sequences available, {len(held_out)} held out")
    prompts = [seq[: job.eval_prompt_tokens] for seq in held_out[: job.eval_prompts]]
    features = out / "features"
    began = time.perf_counter()
    generated = generate_sequences(target, docs, out / "generated.jsonl", features / "generated", job.generate_minutes,
                                   job.generate_tokens, layers, job.seq_len, job.generate_concurrency, job.train.seed,
                                   progress, log)
    if generated:  # the target's own text first (an extraction budget keeps all of it), then the source's
        # (continuations generated with their features need no extraction: generated_sequences skips them)
        train = generated_sequences(generated, job.seq_len, job.train.seed) + train
    # held-out prompts (encoded once): the report speculates on the first eval_prompts, and a run
    # trained on continuations holds out on the target's continuations of the first held_out_sequences
    held_prompts = held_out_prompts(docs, encode, max(job.eval_prompts, job.held_out_sequences), job.train.seed) \
        if generated else []
    prompts = held_prompts[: job.eval_prompts] or prompts
    generate_minutes = add_minutes(features / "generation.json", (time.perf_counter() - began) / 60)

    held_dir = held_out_directory(job, target, held_prompts[: job.held_out_sequences], layers, log)
    began = time.perf_counter()
    if held_dir.name != ON_POLICY_HELD_OUT:  # teacher-forced held-out source: only where it is the curve's data
        extract_features(target.backend, held_out, held_dir, layers, progress=progress)
    shards = extract_features(target.backend, train, features / "train", layers,
                              budget_seconds=job.extract_minutes * 60, progress=progress)
    extract_minutes = add_minutes(features / "extraction.json", (time.perf_counter() - began) / 60)
    depth = target.config.num_layers
    train_data = load_shards(features / "generated", features / "train", num_layers=depth, layers=layers)
    held_data = load_shards(held_dir, num_layers=depth, layers=layers)
    train_tokens = int((train_data["tokens"] >= 0).sum())
    recorded = ", the rest recorded while generating" if generated else ""
    log(f"features: {train_data['tokens'].shape[0]} sequences, {train_tokens} tokens ({shards} source shards{recorded})")

    info = {"kind": job.kind, "target": target.name, "data": job.data, "feature_mode": target.backend.dtype_name,
            "train_sequences": train_data["tokens"].shape[0], "train_tokens": train_tokens,
            "held_out_sequences": held_data["tokens"].shape[0], "held_out_tokens": int((held_data["tokens"] >= 0).sum()),
            "held_out_data": "target continuations" if held_dir.name == ON_POLICY_HELD_OUT else "source text",
            "extract_minutes": round(extract_minutes, 1), "generate_minutes": round(generate_minutes, 1),
            "generated_continuations": len(generated), "feature_layers": list(layers),
            "generated_tokens": sum(len(row["tokens"]) - row["prompt_tokens"] for row in generated),
            "cpu": cpu_description()}
    job = replace(job, train=replace(job.train, precision=choose_precision(job.train.precision, target.backend.device)))
    log(f"training precision: {job.train.precision}")
    info["precision"] = job.train.precision
    if job.kind == "distill":
        return distill_draft(job, target, train_data, held_data, held_dir, prompts, info, progress, log)

    size = min(job.draft_vocab_size or target.config.vocab_size, target.config.vocab_size)
    draft_ids = None
    if job.resume and (out / WEIGHTS_FILE).is_file():
        # a resumed run keeps the vocabulary its checkpoint trained with (first ids, or these ids),
        # whatever --draft-vocab says and whatever data was added since
        draft_ids = saved_draft_ids(out)
        size = len(draft_ids) if draft_ids is not None else size
    elif job.draft_vocab == "frequency" and size < target.config.vocab_size:
        draft_ids = frequency_ids(train_data["target_ids"], size, target.config.vocab_size)
    config = HeadConfig.for_target(target.config, size, job.intermediate_size or None, job.kind, job.num_medusa_heads,
                                   "frequency" if draft_ids is not None else "first", layers)
    torch.manual_seed(job.train.seed)
    parts = TargetParts(target.backend.decoder, draft_ids if draft_ids is not None else size,
                        getattr(torch, job.train.precision))
    head = new_head(config, draft_ids)
    if job.head_init == "target" and job.kind == "eagle" and not (job.resume and (out / "checkpoint.pt").is_file()):
        head.init_from_layer(last_layer_weights(target.backend.decoder, config.intermediate_size))
    head = head.to(parts.device)  # trains where the target runs: CPU, or CUDA when present
    info["head_init"] = job.head_init if job.kind == "eagle" else "random"
    info.update(draft_vocab_size=config.draft_vocab_size, draft_vocab=config.draft_vocab, loss_rows=job.train.loss_rows,
                draft_vocab_coverage=round(coverage(held_data["target_ids"], draft_ids, size), 4),
                head_parameters=sum(p.numel() for p in head.parameters()))
    log(f"draft vocabulary: {size} ids ({config.draft_vocab}), {info['draft_vocab_coverage']:.1%} of the held-out "
        "target tokens")
    history = train_head(head, parts, train_data, held_data, out, job.train, resume=job.resume, training_info=info,
                         progress=progress, log=log)
    info["train_minutes"] = round(history.seconds / 60, 1)
    log(f"trained: {describe(history)}")
    result = None
    if not job.skip_eval:
        gamma = min(job.gamma, job.num_medusa_heads) if job.kind == "medusa" else job.gamma
        if gamma < job.gamma:
            log(f"evaluation: γ {gamma}, not {job.gamma}: {job.num_medusa_heads} medusa heads draft at most that many tokens")
        spec = SpecConfig(method=job.kind, drafter_path=str(out), num_speculative_tokens=gamma)
        result = measure_speculation(target, prompts, spec, job.eval_new_tokens)
        log(result.line())
    return write_report(out, history, result, info)


def held_out_directory(job: DrafterTraining, target, prompts: list[list[int]], layers: tuple[int, ...],  # noqa: ANN001 - LoadedModel
                       log: Callable[[str], None]) -> Path:
    """Where the held-out curve's shards are: a run trained on the target's continuations is held out
    on its continuations of the held-out ``prompts`` (empty for a run on source text alone;
    :func:`~specdec.train.generated.held_out_continuations`), else on teacher-forced held-out source
    (``features/held_out``). A run resumed from before the
    former existed keeps the latter: its curve must not change data midway."""
    features = Path(job.out_dir).expanduser() / "features"
    on_policy = features / ON_POLICY_HELD_OUT
    resumed_older = job.resume and (features.parent / "checkpoint.pt").is_file() and not on_policy.is_dir()
    if prompts and not resumed_older and held_out_continuations(
            target, prompts, on_policy, job.generate_tokens, layers, job.seq_len, job.generate_concurrency, log):
        return on_policy
    return features / "held_out"


def distill_draft(job: DrafterTraining, target, train_data: dict[str, torch.Tensor], held_data: dict[str, torch.Tensor],  # noqa: ANN001 - LoadedModel
                  held_dir: Path, prompts: list[list[int]], info: dict, progress: bool, log: Callable[[str], None]) -> Path:
    """DistillSpec (:mod:`specdec.train.distill`): train the draft's last layers on the target's
    distributions, save it as a model directory, and measure α before and after by speculating.
    ``held_dir``: where ``held_data``'s shards are (the draft's frozen layers' output is kept beside them)."""
    import specdec
    from specdec.train.distill import DraftTail, add_frozen_hidden, check_pair, distill_row_loss, save_draft
    from specdec.train.loop import evaluate_rows, train_module
    from specdec.train.report import measure_speculation, write_report

    out = Path(job.out_dir).expanduser()
    draft = specdec.load_model(job.draft_model, dtype="float32", device=str(target.backend.device), quantize="none",
                               progress=progress)
    check_pair(target.config.vocab_size, draft.config.vocab_size, job.draft_model)
    decoder = draft.backend.decoder
    tail = DraftTail(decoder, job.trainable_layers)
    features = out / "features"
    precision = job.train.precision  # the frozen layers run in the training's arithmetic
    train_data = add_frozen_hidden(decoder, tail.split, train_data, features / "train", progress, precision)
    held_data = add_frozen_hidden(decoder, tail.split, held_data, held_dir, progress, precision)
    parts = TargetParts(target.backend.decoder, target.config.vocab_size, getattr(torch, precision))
    row_loss = distill_row_loss(tail, parts, job.divergence)
    info.update(draft_model=job.draft_model, trainable_layers=job.trainable_layers, divergence=job.divergence,
                trained_parameters=sum(p.numel() for p in tail.parameters()))
    history = train_module(tail, f"{job.draft_model} (last {job.trainable_layers} layers)", row_loss,
                           lambda: evaluate_rows(row_loss, held_data),
                           lambda training: save_draft(decoder, draft.tokenizer, out, training), train_data, out,
                           job.train, resume=job.resume, training_info=info, progress=progress, log=log)
    info["train_minutes"] = round(history.seconds / 60, 1)
    log(f"trained: {describe(history)}")
    result = baseline = None
    if not job.skip_eval:
        # both drafts int8 on a quantized CPU target: converted from the same float32 weights the
        # same way, so only training differs (a GGUF's int4 path reuses its own 4-bit blocks, a
        # directory's is rounded from float: not comparable)
        mode = "none" if target.backend.decoder.quantization is None else "int8"
        spec = SpecConfig(method="draft_model", num_speculative_tokens=job.gamma)
        before = specdec.load_model(job.draft_model, quantize=mode)
        baseline = measure_speculation(target, prompts, spec, job.eval_new_tokens, draft=before)
        log(f"before: {baseline.line()}")
        del before
        result = measure_speculation(target, prompts, spec, job.eval_new_tokens,
                                     draft=specdec.load_model(out, quantize=mode))
        log(f"after: {result.line()}")
    return write_report(out, history, result, info, baseline)


def feature_layers(spec: str, num_layers: int, kind: str) -> tuple[int, ...]:
    """``--feature-layers`` (final | fused | ascending layer numbers: its form read by
    :func:`~specdec.train.feature_spec.parse_feature_layers`, as the CLI reads it) as the target's layers
    a ``kind`` drafter trains on (distill: the final one, whatever layers the spec names), with a clear
    error for layers a head cannot read (:func:`~specdec.models.heads.check_feature_layers`)."""
    from specdec.models.heads import check_feature_layers, fused_layers

    form = parse_feature_layers(spec)
    if kind == "distill" or form == "final":
        return (num_layers,)
    layers = fused_layers(num_layers) if form == "fused" else form
    check_feature_layers(layers, num_layers, kind)
    return layers


def saved_draft_ids(out: Path) -> torch.Tensor | None:
    """The draft ids of the head a run in ``out`` already wrote (None: none, or a first-ids one)."""
    from safetensors import safe_open

    path = out / WEIGHTS_FILE
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as weights:
        return weights.get_tensor("draft_ids") if "draft_ids" in weights.keys() else None
