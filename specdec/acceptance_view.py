"""The acceptance view: one self-contained HTML page that shows where speculation paid.

Every generated token is colored by how it was committed — an accepted draft token, a token the
grammar forced (structured output), the target's correction after a rejection, the bonus token after
a fully accepted draft, or a plain target step (nothing drafted) — and hovering a token shows its
round: what was drafted and how much of it the target kept. Below the text: the accepted-length
histogram and α per draft position (how fast acceptance decays along the draft, which is what γ
trades against). No external resource is loaded (inline CSS, SVG and script), so the file can be
mailed or attached to a bug report.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from specdec.stats import Round, Stats, position_counts
from specdec.tokenizer import IncrementalDetokenizer, Tokenizer

#: token kind → (CSS color, legend text)
KINDS = {
    "prefill": ("#d0d0d0", "first token (prompt pass)"),
    "accepted": ("#9be59b", "accepted draft token"),
    "forced": ("#c9b3f5", "forced by the grammar"),
    "correction": ("#ffb36b", "target's correction (draft rejected)"),
    "bonus": ("#8cc8ff", "bonus token (whole draft accepted)"),
    "target": ("#eeeeee", "target step, nothing drafted"),
}


@dataclass
class TokenCell:
    text: str
    kind: str
    round_index: int  # -1 for the first token


def classify(token_ids: Sequence[int], rounds: Sequence[Round]) -> list[tuple[int, str, int]]:
    """``(token id, kind, round index)`` for each generated token, in order. The first comes from the
    prompt pass; each round then committed its accepted draft tokens, the grammar-forced ones, and
    a correction or bonus token. Tokens a stop condition cut are not in ``token_ids`` and are skipped."""
    cells = [(token_ids[0], "prefill", -1)] if token_ids else []
    for index, step in enumerate(rounds):
        for position, _ in enumerate(step.committed):
            if len(cells) == len(token_ids):
                return cells
            if position < step.accepted:
                kind = "accepted"
            elif position < step.accepted + step.forced:
                kind = "forced"
            elif not step.drafted:
                kind = "target"
            else:
                kind = "bonus" if step.accepted == len(step.drafted) else "correction"
            cells.append((token_ids[len(cells)], kind, index))
    return cells


def alpha_per_position(rounds: Sequence[Round]) -> list[float]:
    """α_j: of the rounds that drafted a j-th token, the fraction that accepted it (j = 1, 2, …)."""
    drafted, accepted = position_counts(list(rounds))
    return [a / d for a, d in zip(accepted, drafted)]


def _bars(values: Sequence[float], labels: Sequence[str], title: str, fmt: str) -> str:
    """A small inline SVG bar chart (no plotting library in a page that must stand alone)."""
    width, height, bar = 40 * max(len(values), 1) + 40, 170, 28
    top = max(values, default=0) or 1
    parts = [f'<svg class="chart" width="{width}" height="{height}" role="img" aria-label="{html.escape(title)}">']
    for i, (value, label) in enumerate(zip(values, labels)):
        h = 120 * value / top
        x = 30 + 40 * i
        parts.append(f'<rect x="{x}" y="{140 - h:.1f}" width="{bar}" height="{h:.1f}" fill="#6b9bd1"><title>{html.escape(label)}: '
                     f'{fmt.format(value)}</title></rect>')
        parts.append(f'<text x="{x + bar / 2}" y="{134 - h:.1f}" text-anchor="middle">{fmt.format(value)}</text>')
        parts.append(f'<text x="{x + bar / 2}" y="158" text-anchor="middle">{html.escape(label)}</text>')
    parts.append('<line x1="25" y1="140" x2="{0}" y2="140" stroke="#555"/></svg>'.format(width - 5))
    return "".join(parts)


def render(tokenizer: Tokenizer, prompt_text: str, token_ids: Sequence[int], stats: Stats, title: str = "") -> str:
    """The page for one generation (``token_ids`` and ``stats`` as :func:`specdec.generate` returns)."""
    detok = IncrementalDetokenizer(tokenizer)
    cells = [TokenCell(detok.push(token), kind, index) for token, kind, index in classify(token_ids, stats.rounds)]
    if cells:
        cells[-1].text += detok.flush()
    spans = "".join(
        f'<span class="tok {c.kind}" data-round="{c.round_index}">{html.escape(c.text)}</span>' for c in cells)
    rounds = [{"drafted": [tokenizer.decode([t], skip_special_tokens=False) for t in r.drafted],
               "accepted": r.accepted, "forced": r.forced} for r in stats.rounds]
    drafting = [r for r in stats.rounds if r.drafted]
    histogram = Counter(r.accepted for r in drafting)
    lengths = list(range(max(histogram, default=0) + 1))
    alphas = alpha_per_position(stats.rounds)
    kinds = Counter(c.kind for c in cells)
    legend = "".join(f'<span class="tok {k}">{html.escape(text)} ({kinds.get(k, 0)})</span> ' for k, (_, text) in KINDS.items())
    styles = "".join(f".{k}{{background:{color}}}" for k, (color, _) in KINDS.items())
    summary = (f"method {html.escape(stats.method)} · {stats.dtype} · {stats.generated_tokens} tokens in "
               f"{stats.target_forwards + 1} target forwards · α {stats.acceptance_rate:.2f} · τ {stats.mean_accepted_len:.2f} · "
               f"{stats.tokens_per_s:.1f} tok/s · {stats.achieved_gb_per_s:.1f} GB/s")
    charts = ""
    if drafting:
        charts = (f"<h2>Accepted draft tokens per round</h2>"
                  f"{_bars([histogram[n] for n in lengths], [str(n) for n in lengths], 'accepted length histogram', '{:.0f}')}"
                  f"<h2>α per draft position</h2>"
                  f"{_bars(alphas, [str(j + 1) for j in range(len(alphas))], 'acceptance per position', '{:.2f}')}")
    return _PAGE.format(title=html.escape(title or "specdec acceptance view"), styles=styles, summary=summary,
                        legend=legend, prompt=html.escape(prompt_text), spans=spans, charts=charts,
                        rounds=json.dumps(rounds).replace("</", "<\\/"))


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body{{font:14px system-ui,sans-serif;margin:24px;max-width:1100px}}
pre{{white-space:pre-wrap;font:13px ui-monospace,monospace;line-height:1.6;border:1px solid #ddd;padding:12px}}
.prompt{{color:#888}} .tok{{border-radius:2px}} .tok.hl{{outline:2px solid #333}}
#round{{position:sticky;top:0;background:#fffbe6;border:1px solid #e6d98c;padding:6px;min-height:1.4em;font:12px ui-monospace,monospace}}
.chart text{{font:11px system-ui,sans-serif}} {styles}
</style></head>
<body>
<h1>{title}</h1>
<p id="summary">{summary}</p>
<p id="legend">{legend}</p>
<div id="round">hover a token to see its round</div>
<pre id="text"><span class="prompt">{prompt}</span>{spans}</pre>
{charts}
<script type="application/json" id="rounds">{rounds}</script>
<script>
(function () {{
  const rounds = JSON.parse(document.getElementById("rounds").textContent);
  const panel = document.getElementById("round");
  const tokens = Array.from(document.querySelectorAll("#text .tok"));
  function show(index) {{
    tokens.forEach(t => t.classList.toggle("hl", t.dataset.round === String(index)));
    if (index < 0) {{ panel.textContent = "first token: sampled from the prompt pass"; return; }}
    const r = rounds[index];
    const drafted = r.drafted.map(JSON.stringify).join(" ");
    panel.textContent = "round " + (index + 1) + ": drafted " + r.drafted.length + " [" + drafted + "], accepted " +
      r.accepted + (r.forced ? ", grammar-forced " + r.forced : "");
  }}
  tokens.forEach(t => t.addEventListener("mouseenter", () => show(Number(t.dataset.round))));
  document.body.dataset.ready = String(tokens.length);
}})();
</script>
</body></html>
"""
