"""Training a drafter head on teacher-forced target features (:mod:`specdec.train.data`); the
losses are :mod:`specdec.train.losses`' (EAGLE's unrolled over ``unroll_steps`` draft steps).

Training is resumable (``checkpoint.pt`` every few minutes: head, optimizer, step, history) and
bounded by a time budget; the head directory is rewritten at every checkpoint, so a cut run still
leaves a usable drafter.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from specdec.errors import SpecdecError
from specdec.models.head_files import save_head
from specdec.models.heads import DraftHead
from specdec.threads import adapt_threads
from specdec.train.losses import head_loss
from specdec.train.precision import mixed_precision
from specdec.train.target_parts import TargetParts


@dataclass
class TrainConfig:
    batch_size: int = 4  # sequences per optimizer step
    lr: float = 5e-4
    warmup_steps: int = 20
    #: after warm-up the rate follows a cosine from ``lr`` down to ``lr × final_lr_ratio`` over the
    #: run's length — its time budget or its step limit, whichever ends it first — so the last
    #: minutes of a budget anneal instead of bouncing at full rate. 1.0 (constant) here, for short
    #: fixed-step runs; ``train-drafter`` decays to 0.1 (``--final-lr-ratio``)
    final_lr_ratio: float = 1.0
    weight_decay: float = 0.0
    reg_weight: float = 1.0
    #: EAGLE weighs the token loss 0.1; with little data it is the token loss that moves top-1
    #: agreement (the tiny model's memorization test: 0.47 at 1.0 vs 0.31 at 0.1), and EAGLE-3
    #: drops the feature loss altogether — both kept, equal
    cls_weight: float = 1.0
    noise: float = 0.05  # input feature noise: uniform ±noise × the row's RMS
    #: eagle: draft steps unrolled per sequence (EAGLE-3's training-time test; 1 = teacher forcing
    #: only). Each step costs about one more pass; see :func:`specdec.train.losses.eagle_loss`
    unroll_steps: int = 3
    #: step s's loss weighs step_decay**s: a later draft token only counts once the earlier ones
    #: were accepted, and equal weights cost the first step's agreement (tiny model, 3 steps: 0.19
    #: vs 0.38 teacher-forced; at 0.3: 0.34, while steps 2 and 3 still doubled)
    step_decay: float = 0.3
    #: > 0 scores the token loss over each sequence's likeliest rows under the target plus
    #: this many drawn at random (sampled softmax: :func:`specdec.train.losses.sampled_rows`), not all
    #: the LM head rows; 0: all
    loss_rows: int = 0
    budget_minutes: float = 60.0
    checkpoint_minutes: float = 5.0
    eval_every: int = 50  # steps between held-out evaluations, at least (see eval_share)
    #: held-out evaluations take at most about this share of a run's time: after one that took d
    #: seconds the next waits for d·(1 − share)/share seconds of training. A time budget counts
    #: training alone, so every 50 steps of a fast step — Medusa's with sampled rows, ~1 s on a
    #: Zen 4 — stretched a 69-minute budget to ~97 minutes of wall time. 1: every eval_every steps
    eval_share: float = 0.1
    max_steps: int = 0  # 0: until the budget or max_epochs
    max_epochs: float = 20.0
    seed: int = 0
    #: the matmuls' precision: float32 | bfloat16 (mixed: float32 weights, optimizer and losses);
    #: ``auto`` is resolved by :func:`specdec.train.precision.choose_precision` before training
    precision: str = "float32"


@dataclass
class History:
    """What the report plots: per step the training loss, per evaluation the held-out numbers."""

    steps: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    eval_top1: list[float] = field(default_factory=list)
    #: per evaluation, top-1 at each draft step (eagle: unrolled on its own predictions; medusa: per head)
    eval_top1_steps: list[list[float]] = field(default_factory=list)
    seconds: float = 0.0  # of training, over every resumed run


#: one training row's loss: ``(data, row, generator)`` → (loss, info with "tokens", "top1",
#: "top1_steps"); ``generator`` None means evaluation (no noise)
RowLoss = Callable[[dict[str, torch.Tensor], int, "torch.Generator | None"], tuple[torch.Tensor, dict]]


def data_row(data: dict[str, torch.Tensor], row: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Row ``row`` of every tensor in ``data`` (the shards stay in CPU memory), on ``device``: the
    target's, where its frozen parts and the trained module live."""
    return {name: tensor[row].to(device, non_blocking=True) for name, tensor in data.items()}


@torch.no_grad()
def evaluate_rows(row_loss: RowLoss, data: dict[str, torch.Tensor]) -> dict[str, float | list[float]]:
    """Token-weighted mean loss and per-step top-1 of ``row_loss`` over every row of ``data``."""
    total = tokens = 0.0
    step_sums: list[float] = []
    for row in range(data["tokens"].shape[0]):
        loss, info = row_loss(data, row, None)
        total += float(loss) * info["tokens"]
        tokens += info["tokens"]
        step_sums = [a + b * info["tokens"] for a, b in zip(step_sums or [0.0] * len(info["top1_steps"]), info["top1_steps"])]
    top1_steps = [value / tokens for value in step_sums]
    return {"loss": total / tokens, "top1": top1_steps[0], "top1_steps": top1_steps}


def head_row_loss(head: DraftHead, parts: TargetParts, config: TrainConfig, report_steps: int = 0) -> RowLoss:
    """:func:`~specdec.train.losses.head_loss` on a row of feature shards (noise only in training);
    ``report_steps``: top-1 for that many draft steps (EAGLE), whatever the loss unrolls."""

    def row_loss(data: dict[str, torch.Tensor], row: int, generator: torch.Generator | None) -> tuple[torch.Tensor, dict]:
        one = data_row(data, row, parts.device)
        return head_loss(head, parts, one["tokens"], one["features"], one["target_ids"],
                         config.noise if generator is not None else 0.0, config.reg_weight, config.cls_weight, generator,
                         config.unroll_steps, config.step_decay, report_steps, config.loss_rows)

    return row_loss


def evaluate(head: DraftHead, parts: TargetParts, data: dict[str, torch.Tensor], config: TrainConfig,
             steps: int = 4) -> dict[str, float | list[float]]:
    """Held-out loss (the training objective's) and top-1 agreement with the target's greedy token:
    ``top1`` teacher-forced (Medusa: the first head), ``top1_steps`` at each of ``steps`` draft
    steps (EAGLE: unrolled on its own predictions, as drafting runs; Medusa: head k)."""
    result = evaluate_rows(head_row_loss(head, parts, config, steps), data)
    result["top1_steps"] = result["top1_steps"][:steps]  # an unroll longer than ``steps`` reports only those
    return result


def learning_rate(config: TrainConfig, step: int, done: float) -> float:
    """Linear warm-up, then a cosine decay to ``final_lr_ratio`` by ``done``, the fraction of the
    run behind us (of the time budget or of the steps, whichever is further: the run's length is a
    time budget, not known in steps; see :func:`schedule_done` for a resumed run)."""
    warmup = min(1.0, (step + 1) / max(1, config.warmup_steps))
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, max(0.0, done))))
    return config.lr * warmup * (config.final_lr_ratio + (1 - config.final_lr_ratio) * cosine)


@dataclass(frozen=True)
class ScheduleAnchor:
    """Where a run was last (re)started on its lr schedule: after ``seconds`` of training and
    ``step`` steps it was ``done`` of the way through. A fresh run's is all zeros."""

    seconds: float = 0.0
    step: int = 0
    done: float = 0.0


def schedule_done(seconds: float, step: int, budget: float, last_step: int,
                  anchor: ScheduleAnchor = ScheduleAnchor()) -> float:
    """How far through its lr schedule a run is after ``seconds`` of training and ``step`` steps,
    with a ``budget`` (seconds; 0 or less: already at its end) and a ``last_step``: the further of the two. From
    ``anchor`` (where a run was resumed) the schedule goes on from the rate it had and ends at the
    new budget, so resuming with a larger budget stretches what is left of the decay instead of
    raising the rate back up (that cost ~300 steps of held-out top-1 in session 38); a run that had
    finished goes on at its final rate. A fresh run gives ``max(seconds / budget, step / last_step)``."""

    def continued(now: float, end: float, start: float) -> float:
        if end <= start:
            return 1.0
        return min(1.0, anchor.done + (1 - anchor.done) * max(0.0, now - start) / (end - start))

    return max(continued(seconds, budget, anchor.seconds), continued(step, max(1, last_step), anchor.step))


def train_head(head: DraftHead, parts: TargetParts, train: dict[str, torch.Tensor], held_out: dict[str, torch.Tensor],
               out_dir: Path, config: TrainConfig, resume: bool = False, training_info: dict | None = None,
               progress: bool = False, log: Callable[[str], None] = lambda _line: None) -> History:
    """Train ``head`` in place until the budget (or ``max_steps``/``max_epochs``) runs out; checkpoints
    and the head directory go to ``out_dir``. ``resume`` continues from ``out_dir/checkpoint.pt``."""
    return train_module(head, f"{head.config.kind} head", head_row_loss(head, parts, config),
                        lambda: evaluate(head, parts, held_out, config),
                        lambda info: save_head(head, out_dir, training=info), train, out_dir, config, resume,
                        training_info, progress, log)


def train_module(module: nn.Module, name: str, row_loss: RowLoss, evaluate_held_out: Callable[[], dict],
                 save_weights: Callable[[dict], object], train: dict[str, torch.Tensor], out_dir: Path,
                 config: TrainConfig, resume: bool = False, training_info: dict | None = None, progress: bool = False,
                 log: Callable[[str], None] = lambda _line: None) -> History:
    """The loop every trained drafter shares: AdamW over ``module``'s trainable parameters with
    warm-up, ``config.batch_size`` random rows of ``train`` per step, a held-out evaluation every
    ``eval_every`` steps (or fewer: ``eval_share``), ``save_weights(training_info)`` plus
    ``out_dir/checkpoint.pt`` every ``checkpoint_minutes`` and at the end; stops at the time budget
    or ``max_steps``/``max_epochs``. ``resume`` continues from the checkpoint (weights, optimizer,
    step, history, data order)."""
    from tqdm import tqdm

    device_type = next(module.parameters()).device.type
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    parameters = [param for param in module.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    history, step, seconds = History(), 0, 0.0
    anchor = ScheduleAnchor()
    checkpoint = out_dir / "checkpoint.pt"
    if resume and checkpoint.is_file():
        try:
            saved = torch.load(checkpoint, weights_only=False, map_location="cpu")  # loading moves them to the module's device
        except Exception as exc:  # noqa: BLE001 - truncated or not a checkpoint: torch raises several kinds
            raise SpecdecError(f"--resume: {checkpoint} is not a readable checkpoint ({type(exc).__name__}); delete it to "
                               "start over, or choose another --out") from None
        try:
            module.load_state_dict(saved["head"])
        except RuntimeError as exc:  # another kind of head, another target's sizes: torch's list of every key
            first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
            raise SpecdecError(f"--resume: {checkpoint} holds a head this run cannot continue (another --kind, target or "
                               f"head shape: {first}); give a new --out or the run's own settings") from None
        optimizer.load_state_dict(saved["optimizer"])
        history, step = History(**saved["history"]), saved["step"]
        seconds = history.seconds
        generator.set_state(saved["generator"])
        # checkpoints from before the anchor resume on the plain seconds / budget schedule
        anchor = ScheduleAnchor(**saved.get("schedule_anchor", {}))
        log(f"resumed at step {step} ({seconds / 60:.1f} min trained)")
    rows = train["tokens"].shape[0]
    steps_per_epoch = max(1, rows // config.batch_size)
    last_step = int(config.max_epochs * steps_per_epoch)
    if config.max_steps:
        last_step = min(last_step, config.max_steps)
    budget = config.budget_minutes * 60
    bar = tqdm(total=budget, initial=min(seconds, budget), desc=f"training {name}", unit="s", disable=not progress,
               bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s {postfix}")
    last_save = time.perf_counter()

    def done() -> float:
        return schedule_done(seconds, step, budget, last_step, anchor)

    def save() -> None:
        info = dict(training_info or {}, steps=step, minutes=round(seconds / 60, 1),
                    train_tokens_seen=history.tokens[-1] if history.tokens else 0, config=asdict(config))
        save_weights(info)
        torch.save({"head": module.state_dict(), "optimizer": optimizer.state_dict(), "history": asdict(history),
                    "step": step, "generator": generator.get_state(),
                    "schedule_anchor": asdict(ScheduleAnchor(seconds, step, done()))}, checkpoint)

    next_evaluation = 0.0  # training seconds before which no periodic evaluation runs (eval_share)

    def record_evaluation() -> str:
        nonlocal next_evaluation
        began = time.perf_counter()
        module.eval()
        with mixed_precision(config.precision, device_type):
            result = evaluate_held_out()
        module.train()
        took = time.perf_counter() - began
        share = min(max(config.eval_share, 1e-3), 1.0)
        next_evaluation = seconds + took * (1 - share) / share
        history.eval_steps.append(step)
        history.eval_loss.append(result["loss"])
        history.eval_top1.append(result["top1"])
        history.eval_top1_steps.append(result["top1_steps"])
        steps_top1 = "/".join(f"{value:.2f}" for value in result["top1_steps"])
        return f"held-out {result['loss']:.3f} top-1 by step {steps_top1}"

    if not history.eval_steps:  # where training starts from: the report's "before"
        bar.set_postfix_str(f"step 0 {record_evaluation()}")
    module.train()
    while step < last_step and seconds < budget:
        # on the cores other processes leave (specdec/threads.py): beside a busy neighbour a step on both cores
        # took 3.3 s, on one 2.0 s (EAGLE head, 128-token rows, Zen 4); quiet, nothing changes
        adapt_threads(torch.device(device_type))
        began = time.perf_counter()
        order = torch.randint(rows, (config.batch_size,), generator=generator)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, step, done())
        optimizer.zero_grad(set_to_none=True)
        batch_loss, batch_tokens = 0.0, 0
        # one row at a time, each freed after its backward: the same update as one backward over
        # the step's rows, which held four rows' graphs at once and ran 8 % fewer steps per minute
        # (3-minute train-drafter runs, session 39)
        for row in order.tolist():
            with mixed_precision(config.precision, device_type):
                loss, info = row_loss(train, row, generator)
            (loss / config.batch_size).backward()
            batch_loss += loss.item() / config.batch_size
            batch_tokens += info["tokens"]
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        step += 1
        seconds += time.perf_counter() - began
        history.seconds = seconds
        history.steps.append(step)
        history.tokens.append((history.tokens[-1] if history.tokens else 0) + batch_tokens)
        history.loss.append(batch_loss)
        if (step % config.eval_every == 0 and seconds >= next_evaluation) or step == last_step or seconds >= budget:
            bar.set_postfix_str(f"step {step} loss {batch_loss:.3f} {record_evaluation()}")
        bar.update(min(seconds, budget) - bar.n)
        if time.perf_counter() - last_save > config.checkpoint_minutes * 60:
            save()
            last_save = time.perf_counter()
    bar.close()
    if step >= last_step and seconds < budget and not (config.max_steps and last_step == config.max_steps):
        # a resumed run with a larger budget stopped here without a word: say why
        log(f"stopped at step {step} with {(budget - seconds) / 60:.1f} min of the budget left: {config.max_epochs:g} "
            f"passes over the {rows} training rows (more rows train further: --max-sequences, --extract-minutes, "
            "--generate-minutes)")
    if not history.eval_steps or history.eval_steps[-1] != step:
        record_evaluation()
    module.eval()
    save()
    return history


def epochs_seen(history: History, train_tokens: int) -> float:
    return (history.tokens[-1] / train_tokens) if history.tokens and train_tokens else 0.0


def describe(history: History) -> str:
    if not history.eval_steps:
        return "no steps"
    return (f"{history.steps[-1] if history.steps else 0} steps, {history.tokens[-1] if history.tokens else 0} tokens; "
            f"held-out loss {history.eval_loss[-1]:.3f}, top-1 {history.eval_top1[-1]:.3f}"
            + (f" (by draft step: {'/'.join(f'{v:.2f}' for v in history.eval_top1_steps[-1])})" if history.eval_top1_steps else "")
            + ("" if math.isfinite(history.eval_loss[-1]) else " (diverged)"))
