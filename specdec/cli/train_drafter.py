"""``specdec train-drafter``: train a drafter for a target on this machine (CPU by default).

``--kind eagle``: a one-layer head over the target's own features (EAGLE); ``--kind medusa``: K
residual heads on the target's last hidden state; ``--kind distill``: align a draft model to the
target (DistillSpec). The target's features come from teacher forcing over text (one prefill per
sequence), training runs within a time budget with checkpoints, and a report measures the result
by actually speculating on held-out prompts. Use it with ``--method eagle|medusa --drafter-path
OUT`` or ``--draft-model OUT``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec.bench.datasets import DOCUMENT_FIELDS
from specdec.cli.common import DEFAULT_TARGET, add_debug_flag
from specdec.cli.values import non_negative_int, positive_int, positive_number
from specdec.config import QUANTIZE_MODES, TRAIN_PRECISIONS
from specdec.errors import SpecdecError
from specdec.models.registry import DEFAULT_DRAFT
from specdec.train.feature_spec import parse_feature_layers

#: what --kind trains (the training job's own list, specdec.train.pipeline.KINDS, which imports torch)
KINDS = ("eagle", "medusa", "distill")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    cmd = subparsers.add_parser(
        "train-drafter", help="train a drafter (EAGLE or Medusa head, or a distilled draft model) for a target on this machine",
        description="Train a drafter for --model: extract the target's features over --data by teacher forcing "
                    "(resumable shards under OUT/features), train the head within --budget-minutes (checkpoints "
                    "every few minutes; --resume continues), then measure it by speculating on held-out documents "
                    "(OUT/report.md, OUT/loss.png). Use it with: specdec generate --method eagle|medusa --drafter-path OUT, "
                    "or for --kind distill: specdec generate --draft-model OUT")
    cmd.add_argument("--kind", default="eagle", choices=KINDS,
                     help="eagle: one decoder layer over [target feature; next-token embedding] with the target's LM head, "
                          "drafting autoregressively on its own features; medusa: K residual heads on the target's last "
                          "hidden state proposing K tokens at once; distill: train --draft-model's last layers on the "
                          "target's distributions (DistillSpec), saved as a model directory (default: eagle)")
    cmd.add_argument("--model", default=DEFAULT_TARGET, help=f"target model: built-in name, .gguf or HF directory (default: {DEFAULT_TARGET})")
    cmd.add_argument("--data", default="stdlib", metavar="stdlib|DATASET|FILE|DIR",
                     help="training text: 'stdlib' (the Python standard library's sources: real code on every machine), "
                          "a dataset (humaneval, gsm8k, spec_bench), a .txt file, a .jsonl file or a .json array "
                          f"(per row: {DOCUMENT_FIELDS}), or a directory of .py/.txt/.md/.rst files; 1 document in 20 is held out "
                          "for evaluation (default: stdlib)")
    cmd.add_argument("--out", required=True, metavar="DIR", help="the trained drafter's directory (config.json, model.safetensors, report)")
    cmd.add_argument("--resume", action="store_true", help="continue a run in --out: keep its feature shards and its checkpoint; with a larger "
                     "--budget-minutes the learning rate goes on from where it was and decays over the added time "
                     "(it never rises again; a finished run goes on at its final rate)")
    cmd.add_argument("--budget-minutes", type=positive_number, default=60.0, metavar="M",
                     help="training time budget in minutes, over all resumed runs (default: 60)")
    cmd.add_argument("--extract-minutes", type=float, default=40.0, metavar="M",
                     help="time for extracting target features by teacher forcing over --data's text (after the "
                          "--generate-minutes continuations, whose features are already recorded), in minutes; no new shard "
                          "of 32 sequences starts after it, and one started is finished (on 2 cores a shard of 256-token "
                          "sequences takes 1-2 min with the 1.5B target); shards already written are kept (default: 40)")
    cmd.add_argument("--generate-minutes", type=float, default=0.0, metavar="M",
                     help="self-distillation: first spend up to M minutes having the target continue prompts drawn "
                          "from --data (each Python function with a docstring: its module's imports, signature and "
                          "docstring; other documents: their opening), greedy, many at a time, recording the target's "
                          "features as it goes (no extraction pass needed for them); the continuations (the text the "
                          "drafter will draft over) train first and the report speculates on held-out prompts of the "
                          "same kind. Kept in OUT/generated.jsonl and OUT/features/generated; --resume adds to them "
                          "(default: 0, none)")
    cmd.add_argument("--generate-tokens", type=positive_int, default=128, metavar="N",
                     help="tokens the target generates per prompt with --generate-minutes (default: 128)")
    cmd.add_argument("--generate-concurrency", type=concurrency_arg, default="auto", metavar="C|auto",
                     help="continuations generated at once (one batched forward per step) with --generate-minutes; "
                          "auto: of 8/16/32/64, the fewest that make ~the most training rows per second by this "
                          "machine's measured step costs (on a 2-core AMX Xeon 64 made 1.5x the rows of 16; 16 where "
                          "nothing is measured, e.g. CUDA) (default: auto)")
    cmd.add_argument("--max-sequences", type=int, default=0, metavar="N",
                     help="at most N training sequences (0: as many as --extract-minutes allows; default: 0)")
    cmd.add_argument("--seq-len", type=sequence_length, default=256, metavar="T",
                     help=f"tokens per training sequence, at least {MIN_SEQ_LEN} (default: 256)")
    cmd.add_argument("--quantize", default="auto", choices=QUANTIZE_MODES,
                     help="the target's execution while extracting features: use the one you will run it with; auto: "
                          "what --quantize auto picks when speculating with this --kind on this CPU (default: auto)")
    cmd.add_argument("--draft-vocab-size", type=positive_int, default=32768, metavar="N",
                     help="the head scores N token ids of the target's LM head: its draft step's main cost (default: 32768)")
    cmd.add_argument("--draft-vocab", default="frequency", choices=["frequency", "first"],
                     help="which N ids: frequency — the N most frequent target tokens in the training data, kept with "
                          "the head (EAGLE-3's draft vocabulary; on code the first 32768 ids miss 5-8%% of the target's "
                          "tokens); first — ids 0..N-1 (BPE ids are roughly frequency-ranked; FR-Spec) (default: frequency)")
    cmd.add_argument("--intermediate-size", type=int, default=0, metavar="N",
                     help="the head's MLP width (0: twice the target's hidden size; default: 0)")
    cmd.add_argument("--head-init", default="random", choices=["random", "target"],
                     help="eagle: the head's decoder layer starts random (small weights) or as the target's last layer "
                          "(attention as is, the MLP cut to its --intermediate-size most important neurons); fc starts "
                          "as 'the next feature is this one' either way (default: random)")
    cmd.add_argument("--num-heads", type=positive_int, default=4, metavar="K",
                     help="medusa: heads, i.e. the most tokens one round drafts (default: 4)")
    cmd.add_argument("--feature-layers", type=feature_layers_arg, default="final", metavar="final|fused|L1,L2,..",
                     help="eagle: which of the target's layers the head reads — final: its final hidden state (EAGLE-1/2); "
                          "fused: a low, a middle and the final one, fused by a linear layer (EAGLE-3's features: 3x the "
                          "feature bytes on disk and in memory); or ascending layer numbers, each the input of that "
                          "layer, the last the number of layers (the final hidden state). Data already extracted must "
                          "hold them (default: final)")
    cmd.add_argument("--draft-model", default=DEFAULT_DRAFT, metavar="NAME|PATH",
                     help=f"distill: the draft model to align (same tokenizer as the target) (default: {DEFAULT_DRAFT})")
    cmd.add_argument("--trainable-layers", type=positive_int, default=2, metavar="N",
                     help="distill: the draft's last N decoder layers and final norm train; the rest stays frozen (default: 2)")
    cmd.add_argument("--divergence", default="kl", choices=["kl", "tvd", "greedy"],
                     help="distill: forward KL(target‖draft); total variation distance (1 − α under sampling); or "
                          "greedy: cross-entropy to the target's greedy token (what greedy acceptance counts; no "
                          "target logits, so faster steps) (default: kl)")
    cmd.add_argument("--unroll-steps", type=positive_int, default=3, metavar="S",
                     help="eagle: draft steps unrolled in training, each reading the head's own previous predictions "
                          "(EAGLE-3's training-time test; 1 = teacher forcing only; each step costs about one more "
                          "pass) (default: 3)")
    cmd.add_argument("--step-decay", type=loss_weight, default=0.3, metavar="W",
                     help="eagle: unrolled step s's loss weighs W**s (a later draft token only counts once the earlier "
                          "ones were accepted) (default: 0.3)")
    cmd.add_argument("--reg-weight", type=loss_weight, default=1.0, metavar="W",
                     help="eagle: weight of the next-feature regression beside the token loss (EAGLE-1/2 regress the "
                          "final layer's next feature; EAGLE-3 drops it: 0) (default: 1)")
    cmd.add_argument("--loss-rows", type=rows_count, default=None, metavar="N",
                     help="eagle, medusa: score the token loss over each sequence's 8 likeliest LM head rows per position "
                          "under the target plus N rows drawn at random (sampled softmax), not all --draft-vocab-size "
                          "rows: those rows' matmuls are most of a training step (0: all rows; default: 2048 — for eagle "
                          "1.65x the steps per minute and a better head at the same budget, for medusa ~5x the steps)")
    cmd.add_argument("--batch-size", type=positive_int, default=4, help="sequences per optimizer step (default: 4)")
    cmd.add_argument("--precision", default="auto", choices=list(TRAIN_PRECISIONS),
                     help="the training matmuls' precision: bfloat16 is mixed (float32 weights, optimizer and losses); "
                          "auto: bfloat16 where it times at least 1.25x faster than float32 on this CPU (AVX-512 BF16 "
                          "or AMX), else float32 (default: auto)")
    cmd.add_argument("--lr", type=positive_number, default=None,
                     help="AdamW learning rate after a 20-step warm-up (default: 2e-3 for eagle and medusa, "
                          "2e-5 for distill: a pretrained model's layers move little)")
    cmd.add_argument("--final-lr-ratio", type=lr_ratio, default=0.1, metavar="R",
                     help="after warm-up the learning rate follows a cosine down to lr x R by the end of the budget "
                          "(1: constant) (default: 0.1)")
    cmd.add_argument("--max-steps", type=non_negative_int, default=0, metavar="N", help="stop after N steps (0: the budget decides; default: 0)")
    cmd.add_argument("--checkpoint-minutes", type=float, default=5.0, metavar="M",
                     help="minutes between checkpoints (the head directory is rewritten each time; default: 5)")
    cmd.add_argument("--held-out-sequences", type=positive_int, default=32, metavar="N",
                     help="held-out sequences for the loss and top-1 curves (default: 32)")
    cmd.add_argument("--eval-prompts", type=positive_int, default=8, metavar="N",
                     help="held-out prompts the report speculates on (default: 8)")
    cmd.add_argument("--eval-tokens", type=positive_int, default=64, metavar="N", help="tokens generated per report prompt (default: 64)")
    cmd.add_argument("--num-speculative-tokens", type=positive_int, default=4, metavar="N", help="γ of the report's speculation (default: 4)")
    cmd.add_argument("--skip-eval", action="store_true", help="do not speculate for the report (loss curves only)")
    cmd.add_argument("--seed", type=int, default=0, help="data order, initialisation and noise seed (default: 0)")
    add_debug_flag(cmd)
    cmd.set_defaults(func=run, kind_flags=kind_flags(cmd))
    return cmd


def kind_flags(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.Action, tuple[str, ...]]]:
    """The flags only some kinds read — their help starts with those kinds ("eagle:", "eagle, medusa:") —
    each with its action and its kinds."""
    found = {}
    for action in parser._actions:
        head = (action.help or "").split(":", 1)[0]
        kinds = tuple(kind.strip() for kind in head.split(","))
        if action.dest != "kind" and ":" in (action.help or "") and all(kind in KINDS for kind in kinds):
            found[action.option_strings[0]] = (action, kinds)
    return found


def refuse_other_kinds_flags(args: argparse.Namespace) -> None:
    """A kind's flag set away from its default for another --kind is an error: ``--kind eagle --divergence
    tvd`` trained an EAGLE head and said nothing of the divergence it never used."""
    typed = getattr(args, "typed_flags", set())  # typed at its default too: `--kind medusa --divergence kl` said nothing
    for flag, (action, kinds) in args.kind_flags.items():
        if args.kind not in kinds and (getattr(args, action.dest) != action.default or action.dest in typed):
            raise SpecdecError(f"{flag} is read by --kind {' or '.join(kinds)} only, not {args.kind}")


#: --lr's default per --kind: 10 minutes of EAGLE training on the same data reached held-out top-1
#: 0.255 at 2e-3 vs 0.242 at 5e-4 (session 31, Zen 4). Medusa: 2e-3 with 2048 sampled rows made the
#: best heads yet (session 32: HumanEval τ 1.64 at γ=4 vs 1.37 at 5e-4 and all rows — not an A/B at
#: equal data: 2.8x the data and 69 vs 20 minutes). DistillSpec's as measured before
DEFAULT_LR = {"eagle": 2e-3, "medusa": 2e-3, "distill": 2e-5}


#: the shortest --seq-len: a sequence needs positions to predict past --unroll-steps (1 token left none: a division
#: by zero in the loss average)
MIN_SEQ_LEN = 8


def sequence_length(text: str) -> int:
    value = positive_int(text)
    if value < MIN_SEQ_LEN:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_SEQ_LEN} tokens, got {value}")
    return value


def rows_count(text: str) -> int:
    """--loss-rows: 0 (all rows) or more."""
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (all rows) or a positive number of rows, got {text!r}")
    return value


def lr_ratio(text: str) -> float:
    """--final-lr-ratio: a fraction of the learning rate, 0 to 1."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (a fraction of --lr), got {text}")
    return value


def loss_weight(text: str) -> float:
    """--reg-weight: 0 (off) or more."""
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (off) or more, got {text}")
    return value


def concurrency_arg(text: str) -> int | None:
    """--generate-concurrency: a positive number, or auto (None: chosen by measured step costs)."""
    return None if text == "auto" else positive_int(text)


def feature_layers_arg(text: str) -> str:
    """--feature-layers: final, fused or layer numbers, checked for form here (before the target loads,
    by the training job's own parser); whether the numbers fit the target is checked once its depth is known."""
    try:
        parse_feature_layers(text)
    except SpecdecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def run(args: argparse.Namespace) -> int:
    from specdec.train.loop import TrainConfig
    from specdec.train.pipeline import DrafterTraining, train_drafter

    refuse_other_kinds_flags(args)
    lr = args.lr if args.lr is not None else DEFAULT_LR[args.kind]
    loss_rows = args.loss_rows if args.loss_rows is not None else (0 if args.kind == "distill" else 2048)
    train = TrainConfig(batch_size=args.batch_size, lr=lr, budget_minutes=args.budget_minutes,
                        checkpoint_minutes=args.checkpoint_minutes, max_steps=args.max_steps, seed=args.seed,
                        unroll_steps=args.unroll_steps, step_decay=args.step_decay, precision=args.precision,
                        final_lr_ratio=args.final_lr_ratio, loss_rows=loss_rows, reg_weight=args.reg_weight)
    job = DrafterTraining(model=args.model, out_dir=Path(args.out), kind=args.kind, data=args.data, quantize=args.quantize,
                          seq_len=args.seq_len, max_sequences=args.max_sequences, held_out_sequences=args.held_out_sequences,
                          extract_minutes=args.extract_minutes, generate_minutes=args.generate_minutes,
                          generate_tokens=args.generate_tokens, generate_concurrency=args.generate_concurrency,
                          draft_vocab_size=args.draft_vocab_size, draft_vocab=args.draft_vocab,
                          intermediate_size=args.intermediate_size, head_init=args.head_init,
                          num_medusa_heads=args.num_heads,
                          feature_layers=args.feature_layers, draft_model=args.draft_model,
                          trainable_layers=args.trainable_layers, divergence=args.divergence, resume=args.resume,
                          eval_prompts=args.eval_prompts,
                          eval_new_tokens=args.eval_tokens, gamma=args.num_speculative_tokens, skip_eval=args.skip_eval,
                          train=train)
    report = train_drafter(job, progress=True, log=lambda line: print(line, file=sys.stderr))
    use = f"--draft-model {args.out}" if args.kind == "distill" else f"--method {args.kind} --drafter-path {args.out}"
    print(f"report: {report}\nuse it: specdec generate {use}")
    return 0
