"""The training loop's schedule, precision and bookkeeping: the learning rate's warm-up and decay over a time
budget, and mixed-precision training (specdec/train/precision.py): the choice, the frozen LM head
rows' dtype, and that a bfloat16 run still learns while keeping float32 weights."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.train.loop import ScheduleAnchor, TrainConfig, evaluate, learning_rate, schedule_done, train_head, train_module
from specdec.train.precision import choose_precision, mixed_precision
from specdec.train.target_parts import TargetParts
from tests.test_heads import periodic_data, random_head


def test_learning_rate_warms_up_then_decays_to_its_final_ratio_by_the_end_of_the_run():
    config = TrainConfig(lr=1e-3, warmup_steps=10, final_lr_ratio=0.1)
    assert learning_rate(config, 0, 0.0) == pytest.approx(1e-4)  # warm-up: step 1 of 10
    assert learning_rate(config, 9, 0.0) == pytest.approx(1e-3)
    assert learning_rate(config, 50, 0.5) == pytest.approx(0.55e-3)  # half-way down the cosine
    assert learning_rate(config, 99, 1.0) == pytest.approx(1e-4)
    assert learning_rate(config, 99, 1.7) == pytest.approx(1e-4)  # past the budget: stays at the floor
    constant = TrainConfig(lr=1e-3, warmup_steps=1, final_lr_ratio=1.0)
    assert {learning_rate(constant, step, step / 10) for step in range(10)} == {1e-3}


def test_a_resumed_schedule_goes_on_from_its_rate_and_ends_at_the_new_budget():
    assert schedule_done(30, 0, 60, 1000) == pytest.approx(0.5)  # a fresh run: the time share
    assert schedule_done(30, 900, 60, 1000) == pytest.approx(0.9)  # or the step share, if further
    # cut at 20 of 60 minutes (done 1/3), resumed with 120: from 1/3 at 20 to 1 at 120
    anchor = ScheduleAnchor(seconds=20, step=100, done=1 / 3)
    assert schedule_done(20, 100, 120, 10**6, anchor) == pytest.approx(1 / 3)
    assert schedule_done(70, 200, 120, 10**6, anchor) == pytest.approx(1 / 3 + (2 / 3) / 2)
    assert schedule_done(120, 300, 120, 10**6, anchor) == pytest.approx(1.0)
    # resumed with the same budget: the same schedule as never stopping
    same = ScheduleAnchor(seconds=20, step=100, done=20 / 60)
    assert schedule_done(45, 200, 60, 10**6, same) == pytest.approx(45 / 60)
    # a finished run given more time stays at its final rate; so does one resumed past its budget
    assert schedule_done(70, 400, 120, 10**6, ScheduleAnchor(60, 300, 1.0)) == 1.0
    assert schedule_done(70, 400, 50, 10**6, ScheduleAnchor(60, 300, 0.8)) == 1.0
    # a step limit raised on resume stretches the same way
    assert schedule_done(0, 15, 10**9, 20, ScheduleAnchor(0, 10, 0.5)) == pytest.approx(0.75)


def test_a_resumed_run_never_raises_its_learning_rate(tmp_path, monkeypatch):
    """End to end through the checkpoint: a run stopped by its step limit and resumed with a larger
    one goes on from the schedule point it reached (session 38's resume jumped back up the cosine)."""
    import specdec.train.loop as loop

    seen: list[float] = []
    real = loop.learning_rate
    monkeypatch.setattr(loop, "learning_rate", lambda config, step, done: seen.append(done) or real(config, step, done))
    module = torch.nn.Linear(4, 1)
    data = {"tokens": torch.zeros(8, 1), "x": torch.randn(8, 4)}

    def row_loss(data, row, generator):  # noqa: ANN001, ANN202 - the loop's RowLoss
        return module(data["x"][row]).pow(2).sum(), {"tokens": 1}

    def evaluation() -> dict:
        return {"loss": 0.0, "top1": 0.0, "top1_steps": [0.0]}

    def run(max_steps: int, resume: bool) -> list[float]:
        seen.clear()
        config = TrainConfig(max_steps=max_steps, budget_minutes=10**6, batch_size=1, max_epochs=100, final_lr_ratio=0.1)
        train_module(module, "probe", row_loss, evaluation, lambda info: None, data, tmp_path, config, resume=resume)
        return list(seen)

    first = run(10, resume=False)
    assert first == pytest.approx([step / 10 for step in range(10)])
    resumed = run(20, resume=True)
    assert len(resumed) == 10 and min(resumed) >= max(first)  # the rate never rises again
    assert resumed == pytest.approx([1.0] * 10)  # that run had finished: it goes on at its final rate


def test_every_training_step_and_extracted_sequence_runs_on_the_cores_others_leave(tmp_path, monkeypatch, tiny_target):
    """Training runs for hours beside whatever else the machine does: a busy neighbour made each step on both
    cores 1.65x slower than on one (Zen 4, EAGLE head), so the loop asks the thread governor before every step,
    and feature extraction before every sequence's prefill, as decoding does between forwards."""
    import specdec.train.data as data_module
    import specdec.train.loop as loop

    asked: list[str] = []
    monkeypatch.setattr(loop, "adapt_threads", lambda device: asked.append(device.type))
    monkeypatch.setattr(data_module, "adapt_threads", lambda device: asked.append("extract:" + device.type))
    module = torch.nn.Linear(4, 1)
    data = {"tokens": torch.zeros(8, 1), "x": torch.randn(8, 4)}
    config = TrainConfig(max_steps=3, budget_minutes=60, batch_size=2, max_epochs=100)
    train_module(module, "probe", lambda d, row, g: (module(d["x"][row]).pow(2).sum(), {"tokens": 1}),
                 lambda: {"loss": 0.0, "top1": 0.0, "top1_steps": [0.0]}, lambda info: None, data, tmp_path, config)
    assert asked == ["cpu"] * 3
    data_module.teacher_forced(tiny_target.backend, [1, 2, 3, 4])
    assert asked[-1] == "extract:cpu"


def test_a_step_is_the_mean_of_its_rows_gradients(tmp_path):
    """A step's update is AdamW's (first step) on the clipped gradient of the mean of its drawn
    rows' losses, however the loop accumulates it (one backward per row keeps one graph alive)."""
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 2)
    start = {name: p.detach().clone() for name, p in module.named_parameters()}
    data = {"tokens": torch.zeros(8, 1), "x": torch.randn(8, 4), "y": torch.randn(8, 2)}

    def row_loss(data, row, generator):  # noqa: ANN001, ANN202 - the loop's RowLoss
        return (module(data["x"][row]) - data["y"][row]).pow(2).sum(), {"tokens": 1}

    config = TrainConfig(max_steps=1, batch_size=4, budget_minutes=60, warmup_steps=1, max_epochs=100, seed=3)
    train_module(module, "probe", row_loss, lambda: {"loss": 0.0, "top1": 0.0, "top1_steps": [0.0]},
                 lambda info: None, data, tmp_path, config)
    rows = torch.randint(8, (4,), generator=torch.Generator().manual_seed(3)).tolist()  # the loop's draw
    reference = torch.nn.Linear(4, 2)
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p.copy_(start[name])
    for row in rows:
        ((reference(data["x"][row]) - data["y"][row]).pow(2).sum() / 4).backward()
    torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 1.0)
    torch.optim.AdamW(reference.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay).step()
    for name, p in module.named_parameters():
        assert torch.allclose(p, dict(reference.named_parameters())[name], atol=1e-7), name
        assert not torch.equal(p, start[name])


def test_slow_evaluations_are_spaced_to_a_share_of_the_run(tmp_path):
    """A held-out evaluation much slower than a step waits for eval_share of the time to have
    passed in training (the budget counts training alone: frequent slow evaluations stretched a
    run's wall time by 40 %); with eval_share 1 it runs every eval_every steps as before."""
    import time

    module = torch.nn.Linear(4, 1)
    data = {"tokens": torch.zeros(8, 1), "x": torch.randn(8, 4)}

    def row_loss(data, row, generator):  # noqa: ANN001, ANN202 - the loop's RowLoss
        return module(data["x"][row]).pow(2).sum(), {"tokens": 1}

    def slow_evaluation() -> dict:
        time.sleep(0.02)
        return {"loss": 0.0, "top1": 0.0, "top1_steps": [0.0]}

    runs = {}
    for share in (0.1, 1.0):
        (tmp_path / str(share)).mkdir()
        config = TrainConfig(max_steps=100, eval_every=5, budget_minutes=5, eval_share=share, checkpoint_minutes=60,
                             batch_size=1, max_epochs=100)
        runs[share] = train_module(module, "probe", row_loss, slow_evaluation, lambda info: None, data,
                                   tmp_path / str(share), config).eval_steps
    assert runs[1.0] == list(range(0, 101, 5))
    # at most one per 0.18 s of training (0.02 s × 0.9 / 0.1) plus the first and the last
    assert runs[0.1][0] == 0 and runs[0.1][-1] == 100 and len(runs[0.1]) < len(runs[1.0]) // 2, runs[0.1]


def test_explicit_precisions_are_taken_and_auto_times_both(monkeypatch):
    assert choose_precision("float32") == "float32"
    assert choose_precision("bfloat16") == "bfloat16"
    with pytest.raises(SpecdecError, match="not one of auto, float32, bfloat16"):
        choose_precision("fp8")
    # auto follows the timing, whichever CPU this is
    timings = {torch.float32: 1.0, torch.bfloat16: 0.5}
    monkeypatch.setattr("specdec.train.precision.matmul_seconds", lambda dtype: timings[dtype])
    assert choose_precision("auto") == "bfloat16"
    timings[torch.bfloat16] = 0.9  # faster, but not by enough to round activations for it
    assert choose_precision("auto") == "float32"
    timings[torch.bfloat16] = 3.0  # an AVX2 CPU emulating bfloat16
    assert choose_precision("auto") == "float32"
    # on a GPU auto asks the card, not a CPU timing (a training there runs on the target's device)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert choose_precision("auto", "cuda") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert choose_precision("auto", "cuda") == "float32"
    assert choose_precision("float32", "cuda") == "float32"


def test_bfloat16_parts_give_float32_logits_close_to_float32s(tiny_target):
    decoder = tiny_target.backend.decoder
    exact, rounded = TargetParts(decoder, 300), TargetParts(decoder, 300, torch.bfloat16)
    assert rounded.lm_rows.dtype == torch.bfloat16
    hidden = torch.randn(7, tiny_target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    logits = rounded.logits(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (7, 300)
    reference = exact.logits(hidden)
    assert not torch.equal(logits, reference)  # it did run in bfloat16
    assert torch.allclose(logits, reference, atol=0.05 * float(reference.abs().max()))


def test_bfloat16_training_lowers_the_loss_with_float32_weights(tiny_target, tmp_path):
    data = periodic_data(tiny_target, 16)
    parts = TargetParts(tiny_target.backend.decoder, tiny_target.config.vocab_size, torch.bfloat16)
    head = random_head(tiny_target)
    config = TrainConfig(max_steps=60, lr=3e-3, eval_every=30, budget_minutes=5, precision="bfloat16")
    before = evaluate(head, parts, data, config)
    train_head(head, parts, data, data, tmp_path, config, progress=False)
    after = evaluate(head, parts, data, config)
    assert after["loss"] < 0.9 * before["loss"] and after["top1"] > before["top1"]
    assert all(param.dtype == torch.float32 for param in head.parameters())


def test_mixed_precision_rounds_matmuls_only_when_asked():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with mixed_precision("float32"):
        assert (x @ w).dtype == torch.float32
    with mixed_precision("bfloat16"):
        assert (x @ w).dtype == torch.bfloat16


def test_stage_minutes_add_up_over_resumed_runs(tmp_path):
    from specdec.train.data import add_minutes

    record = tmp_path / "features" / "extraction.json"
    assert add_minutes(record, 12.5) == 12.5
    assert add_minutes(record, 0.0) == 12.5  # a resumed run that extracted nothing
    assert add_minutes(record, 2.5) == 15.0


@pytest.mark.parametrize("flag, value, message", [("--final-lr-ratio", "1.5", "between 0 and 1"),
                                                  ("--final-lr-ratio", "-0.1", "between 0 and 1"),
                                                  ("--precision", "fp8", "invalid choice"),
                                                  ("--loss-rows", "-5", "0 (all rows)"),
                                                  ("--loss-rows", "many", "0 (all rows)"),
                                                  ("--reg-weight", "-1", "0 (off) or more"),
                                                  ("--reg-weight", "x", "invalid loss_weight value")])
def test_train_drafter_refuses_bad_schedule_and_precision_flags(flag, value, message, tmp_path, capsys):
    from specdec.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["train-drafter", "--out", str(tmp_path / "head"), flag, value])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "head").exists()  # refused before anything was loaded or written


def test_sampled_rows_hold_each_positions_likeliest_and_drawn_others():
    from specdec.train.losses import SAMPLED_TOP, sampled_rows

    target_logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(0))
    rows, log_inclusion = sampled_rows(target_logits, 100, torch.Generator().manual_seed(1))
    top = set(torch.topk(target_logits, SAMPLED_TOP, dim=-1).indices.flatten().tolist())
    assert len(set(rows.tolist())) == len(rows) == len(top) + 100  # no row twice
    assert set(rows[: len(top)].tolist()) == top and not log_inclusion[: len(top)].any()
    assert torch.allclose(log_inclusion[len(top):], torch.tensor(math.log(100 / (1000 - len(top)))))


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_a_sampled_token_loss_over_every_row_is_the_full_loss(tiny_target, kind):
    """Drawing all the other rows (inclusion probability 1) leaves only their order changed: the
    loss and top-1 must be the full loss's; drawing fewer changes the loss."""
    from specdec.train.losses import head_loss

    data = periodic_data(tiny_target, 1)
    parts = TargetParts(tiny_target.backend.decoder, 300)
    head = random_head(tiny_target, draft_vocab_size=300, kind=kind)
    args = (head, parts, data["tokens"][0], data["features"][0], data["target_ids"][0], 0.0, 1.0, 1.0)

    def loss(loss_rows: int):
        return head_loss(*args, torch.Generator().manual_seed(0), 3, 0.3, 0, loss_rows)

    full, full_info = loss(0)
    every, every_info = loss(300)
    assert torch.allclose(full, every, rtol=1e-5) and full_info["top1_steps"] == every_info["top1_steps"]
    assert not torch.allclose(full, loss(20)[0], rtol=1e-3)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_a_sampled_token_loss_trains_the_head(tiny_target, tmp_path, kind):
    data = periodic_data(tiny_target, 16)
    parts = TargetParts(tiny_target.backend.decoder, tiny_target.config.vocab_size)
    head = random_head(tiny_target, kind=kind)
    config = TrainConfig(max_steps=60, lr=3e-3, eval_every=30, budget_minutes=5, loss_rows=32)
    before = evaluate(head, parts, data, config)  # evaluation scores every row
    train_head(head, parts, data, data, tmp_path, config, progress=False)
    after = evaluate(head, parts, data, config)
    assert after["loss"] < 0.9 * before["loss"] and after["top1"] > before["top1"]


def test_a_resume_with_other_data_settings_is_refused_before_anything_runs(tmp_path):
    """--resume over a run made with another --seq-len mixed shard shapes, another --data skipped or
    repeated data, another --kind extracted minutes of features before the checkpoint refused the head:
    now each is one error naming what changed, before any model loads, and the run is left as it was."""
    from specdec.train.pipeline import RUN_FILE, DrafterTraining, check_run_identity

    lines: list[str] = []
    out = tmp_path / "run"
    first = DrafterTraining(model="tiny", out_dir=out, kind="eagle", data="stdlib", seq_len=64)
    check_run_identity(first, out, lines.append)
    saved = (out / RUN_FILE).read_text()
    check_run_identity(replace(first, resume=True), out, lines.append)  # the same settings: fine
    for change, words in (({"seq_len": 32}, "--seq-len 64 (now 32)"), ({"kind": "medusa"}, "--kind eagle (now medusa)"),
                          ({"data": "other.jsonl"}, "--data stdlib (now other.jsonl)")):
        with pytest.raises(SpecdecError, match=re.escape(words)):
            check_run_identity(replace(first, resume=True, **change), out, lines.append)
    assert (out / RUN_FILE).read_text() == saved
    (out / "features").mkdir()  # an extraction cut short (no checkpoint): its shards would be reused by index too
    with pytest.raises(SpecdecError, match=re.escape("--seq-len 64 (now 32)")):
        check_run_identity(replace(first, seq_len=32), out, lines.append)
    fresh = tmp_path / "new"
    check_run_identity(replace(first, out_dir=fresh, resume=True), fresh, lines.append)
    assert any("holds no run yet" in line for line in lines)


def test_a_model_folder_and_a_corrupt_run_are_refused_as_out(tmp_path):
    """--out pointing at a model's own folder replaced its config.json and weights with the head's (exit 0); a corrupt
    run.json under --resume was a JSONDecodeError traceback."""
    from specdec.train.pipeline import RUN_FILE, DrafterTraining, check_run_identity

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    job = DrafterTraining(model="tiny", out_dir=model, kind="eagle", data="stdlib", seq_len=64)
    with pytest.raises(SpecdecError, match="holds a model .config.json, model.safetensors. and no training run"):
        check_run_identity(job, model, print)
    assert (model / "config.json").read_text() == "{}" and not (model / RUN_FILE).exists()
    run = tmp_path / "run"
    run.mkdir()
    (run / RUN_FILE).write_text("{not json")
    with pytest.raises(SpecdecError, match="not a run's settings .corrupt."):
        check_run_identity(replace(job, out_dir=run, resume=True), run, print)
