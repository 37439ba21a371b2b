"""A trained drafter's report: its loss curve (PNG), and what it does when it actually speculates.

The numbers that matter are measured by speculating: held-out prompts (documents the head never
trained on) are decoded greedily with the head and plainly, in the same process, interleaved; the
report gives α, τ, per-position acceptance (P(the first j drafted tokens are all accepted)), the
head's cost per draft token relative to a target step, and the tokens/s ratio to plain decoding.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from specdec.config import SpecConfig
from specdec.stats import position_counts
from specdec.train.loop import History


#: what the held-out top-1 per step is, by kind: EAGLE drafts each step on its own predicted features
STEP_WORDS = {"eagle": "by draft step (on its own predictions)", "medusa": "by head (token +1, +2, …)"}


@dataclass
class SpeculationResult:
    prompts: int
    new_tokens: int
    gamma: int
    acceptance_rate: float
    mean_accepted_len: float
    position_accept: list[float]  # per draft position j: of the rounds that drafted it, the share accepted
    speedup_median: float  # per prompt: speculative tokens/s ÷ plain tokens/s, median
    draft_cost_ratio: float  # one draft token's time ÷ one target step's, median over prompts
    identical: bool  # greedy output equal to plain decoding on every prompt

    def line(self) -> str:
        positions = ", ".join(f"{p:.2f}" for p in self.position_accept)
        return (f"{self.prompts} held-out prompts × {self.new_tokens} tokens, γ={self.gamma}: α {self.acceptance_rate:.3f}, "
                f"τ {self.mean_accepted_len:.2f}, acceptance at draft positions 1..{len(self.position_accept)} (of the "
                f"rounds that drafted each): [{positions}], "
                f"draft cost {self.draft_cost_ratio:.3f} of a target step, {self.speedup_median:.2f}× plain decoding "
                f"(median), outputs identical to plain: {'yes' if self.identical else 'NO'}")


def measure_speculation(target, prompts: list[list[int]], spec: SpecConfig, new_tokens: int = 64,  # noqa: ANN001 - LoadedModel
                        draft=None) -> SpeculationResult:  # noqa: ANN001 - LoadedModel
    """Greedy decoding of each prompt with ``spec`` (and ``draft``, for a draft model) and plainly,
    interleaved in the same process."""
    import specdec
    from specdec.sampling import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    gamma = spec.num_speculative_tokens
    specdec.generate(target, prompts[0][:16], params, spec=spec, draft=draft)  # warm-up: loads a head, packs weights
    specdec.generate(target, prompts[0][:16], params)  # and plain decoding's first run, timed cold before (a 2.6x "speedup"
    # next to a draft costing 1.3 target steps)
    rounds, ratios, costs = [], [], []
    accepted = proposed = forwards = decoded = 0
    identical = True
    for ids in prompts:
        plain = specdec.generate(target, ids, params)
        out = specdec.generate(target, ids, params, spec=spec, draft=draft)
        identical &= out.token_ids == plain.token_ids
        stats = out.stats
        rounds.extend(stats.rounds)
        accepted += stats.accepted_tokens
        proposed += stats.proposed_tokens
        forwards += stats.target_forwards
        decoded += stats.committed_tokens  # what the decode forwards committed (τ: Stats.mean_accepted_len)
        if plain.stats.tokens_per_s:
            ratios.append(stats.tokens_per_s / plain.stats.tokens_per_s)
        costs.append(stats.draft_cost_ratio)
    drafted, accepted_at = position_counts(rounds)
    return SpeculationResult(
        prompts=len(prompts), new_tokens=new_tokens, gamma=gamma,
        acceptance_rate=accepted / proposed if proposed else 0.0,
        mean_accepted_len=decoded / forwards if forwards else 0.0,
        position_accept=[a / d if d else 0.0 for d, a in zip(drafted, accepted_at)],
        speedup_median=statistics.median(ratios) if ratios else 0.0,
        draft_cost_ratio=statistics.median(costs) if costs else 0.0, identical=identical)


def plot_history(history: History, path: Path, loss_rows: int = 0) -> Path:
    """Loss and held-out top-1 curves; ``loss_rows`` > 0: the training loss was a sampled softmax
    (:func:`specdec.train.losses.sampled_rows`), which reads lower than the held-out loss over every
    row — the legend says so, lest the gap look like overfitting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, top1_ax) = plt.subplots(1, 2, figsize=(11, 4))
    if history.loss:
        window = max(1, len(history.loss) // 50)
        smooth = [statistics.fmean(history.loss[max(0, i - window + 1): i + 1]) for i in range(len(history.loss))]
        sampled = f"\nsampled softmax over {loss_rows} rows:\nreads lower than held-out" if loss_rows else ""
        loss_ax.plot(history.tokens, smooth, label=f"training{f' (mean of {window} steps)' if window > 1 else ''}{sampled}")
    token_at = dict(zip(history.steps, history.tokens))
    eval_tokens = [token_at.get(step, 0) for step in history.eval_steps]
    loss_ax.plot(eval_tokens, history.eval_loss, "o-", label="held-out")
    loss_ax.set_xlabel("training tokens")
    loss_ax.set_ylabel("loss")
    loss_ax.legend(fontsize="small")  # a long entry ran past the figure's edge over the axis label
    # evaluations before per-step numbers were kept (older checkpoints) have only step 1
    offset = len(history.eval_top1) - len(history.eval_top1_steps)
    by_step = [history.eval_top1_steps[i - offset] if i >= offset else [top1] for i, top1 in enumerate(history.eval_top1)]
    for step in range(max((len(values) for values in by_step), default=0)):
        points = [(tokens, values[step]) for tokens, values in zip(eval_tokens, by_step) if len(values) > step]
        top1_ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=f"draft step {step + 1}")
    top1_ax.set_xlabel("training tokens")
    top1_ax.set_ylabel("held-out top-1 agreement with the target")
    top1_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(out_dir: Path, history: History, result: SpeculationResult | None, info: dict,
                 baseline: SpeculationResult | None = None) -> Path:
    """``report.md`` + ``report.json`` + ``loss.png`` in ``out_dir``; ``baseline``: the same
    measurement before training (distill: the draft as it was)."""
    plot_history(history, out_dir / "loss.png", info.get("loss_rows", 0))
    data = {"training": info, "history": history.__dict__,
            "speculation": None if result is None else result.__dict__,
            "speculation_before": None if baseline is None else baseline.__dict__}
    kind = info.get("kind", "eagle")
    made = (f"{info.get('draft_model')} distilled ({info.get('divergence')}, last {info.get('trainable_layers')} layers, "
            f"{info.get('trained_parameters')} parameters trained)" if kind == "distill" else
            f"{info.get('head_parameters')} parameters, {info.get('draft_vocab_size')} draft-vocabulary rows")
    (out_dir / "report.json").write_text(json.dumps(data, indent=1) + "\n")
    title = f"{info.get('draft_model')} aligned to" if kind == "distill" else f"{kind} head for"
    lines = [f"# {title} {info.get('target', '?')}", "",
             f"- data: {info.get('data')} — {info.get('train_sequences')} training sequences "
             f"({info.get('train_tokens')} tokens), {info.get('held_out_sequences')} held-out sequences "
             f"({info.get('held_out_tokens')} tokens, {info.get('held_out_data', 'source text')}) from documents never trained on"
             + (f"; first the target's own continuations of {info['generated_continuations']} prompts from it "
                f"({info.get('generated_tokens')} generated tokens, {info.get('generate_minutes')} min of generation; "
                f"self-distillation), and the report's prompts are "
                f"held-out ones of the same kind" if info.get("generated_continuations") else ""),
             f"- features: {info.get('feature_mode')} target, {info.get('extract_minutes')} min of extraction",
             f"- training: {history.steps[-1] if history.steps else 0} steps, {history.tokens[-1] if history.tokens else 0} "
             f"tokens seen, {info.get('train_minutes')} min in {info.get('precision', 'float32')}; CPU: {info.get('cpu')}",
             (f"- held-out before training: loss {history.eval_loss[0]:.3f}, teacher-forced top-1 {history.eval_top1[0]:.3f}\n"
              if history.eval_steps and history.eval_steps[0] == 0 and len(history.eval_steps) > 1 else "")
             + f"- held-out: loss {history.eval_loss[-1]:.3f}, teacher-forced top-1 {history.eval_top1[-1]:.3f}"
             + (f"; top-1 {STEP_WORDS.get(kind, 'by draft step')}: "
                f"{', '.join(f'{v:.3f}' for v in history.eval_top1_steps[-1])}"
                if history.eval_top1_steps and len(history.eval_top1_steps[-1]) > 1 else "")
             if history.eval_loss else "- held-out: not evaluated",
             f"- {'draft' if kind == 'distill' else 'head'}: {made}",
             "", "## Speculating on held-out prompts", "",
             *([f"- before: {baseline.line()}", f"- after: {result.line()}" if result is not None else ""]
               if baseline is not None else [result.line() if result is not None else "not measured (--skip-eval)"]),
             "", "![loss](loss.png)", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    return out_dir / "report.md"
