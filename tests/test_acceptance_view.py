"""The acceptance view (`specdec generate --html FILE`): every generated token drawn once with the kind
the engine's rounds give it, counts that agree with the statistics, a page that loads nothing from
outside, and — in a real headless Chromium — a page that renders, runs its script without console
errors and shows the tokens."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess

import pytest

import specdec
from specdec.acceptance_view import alpha_per_position, classify, render
from specdec.sampling import SamplingParams
from specdec.stats import Round

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def generate(tiny_target, tiny_draft, method: str = "draft_model", **params):  # noqa: ANN001, ANN201
    sampling = SamplingParams(**{"temperature": 0, "max_tokens": 40, "ignore_eos": True, **params})
    return specdec.generate(tiny_target, "def fibonacci(n):", sampling, draft=tiny_draft,
                            spec=specdec.SpecConfig(method=method, num_speculative_tokens=3))


def test_classify_follows_the_rounds():
    rounds = [Round([5, 6, 7], 3, 0, [5, 6, 7, 8]), Round([9, 9], 1, 0, [9, 4]), Round([], 0, 0, [3]),
              Round([1], 1, 2, [1, 2, 3, 4])]
    tokens = [0, 5, 6, 7, 8, 9, 4, 3, 1, 2, 3]  # the last round cut by a stop after 3 of its tokens
    kinds = [kind for _, kind, _ in classify(tokens, rounds)]
    assert kinds == ["prefill", "accepted", "accepted", "accepted", "bonus", "accepted", "correction", "target",
                     "accepted", "forced", "forced"]
    assert alpha_per_position(rounds) == [3 / 3, 1 / 2, 1 / 1]


def test_every_token_drawn_once_with_counts_matching_the_stats(tiny_target, tiny_draft):
    out = generate(tiny_target, tiny_draft)
    page = render(tiny_target.tokenizer, "def fibonacci(n):", out.token_ids, out.stats)
    spans = re.findall(r'<span class="tok (\w+)" data-round="(-?\d+)">(.*?)</span>', page, re.S)
    assert len(spans) == len(out.token_ids)
    assert "".join(html.unescape(text) for _, _, text in spans) == out.text
    kinds = [kind for kind, _, _ in spans]
    assert kinds.count("accepted") == out.stats.accepted_tokens
    assert kinds.count("correction") + kinds.count("bonus") + kinds.count("target") == out.stats.target_forwards
    assert not re.search(r'(src|href)="(https?:)?//', page)  # self-contained
    assert "α per draft position" in page and "<svg" in page


def test_cli_writes_the_page(tiny_dirs, tmp_path, capsys):
    from specdec.cli import main

    page = tmp_path / "view.html"
    code = main(["generate", "def f(x):", "--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]),
                 "--dtype", "float32", "--quantize", "none", "--max-tokens", "16", "--ignore-eos", "--html", str(page)])
    assert code == 0, capsys.readouterr().err
    assert page.read_text().count('data-round=') == 16


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="needs Debian's chromium (make browser)")
def test_page_renders_in_headless_chromium(tiny_target, tiny_draft, tmp_path):
    assert CHROMIUM is not None, "CI installs chromium (make browser): the page must be tested in a real browser"
    out = generate(tiny_target, tiny_draft)
    path = tmp_path / "view.html"
    path.write_text(render(tiny_target.tokenizer, "def fibonacci(n):", out.token_ids, out.stats), encoding="utf-8")
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([*flags, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f'data-ready="{len(out.token_ids)}"' in dom.stdout  # the script ran over every token
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    shot = tmp_path / "view.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1200,900", path.as_uri()],
                   capture_output=True, text=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
