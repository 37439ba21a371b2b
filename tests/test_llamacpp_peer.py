"""The llama.cpp peer's client: process lifecycle, request fields, stats mapping, clear errors.

CI has no llama.cpp build, so a stand-in ``llama-server`` (a small HTTP script speaking the same
/health and /completion protocol) checks what we send and returns what llama-server returns.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams

STAND_IN = '''#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
has_draft = "-md" in args
log = {log!r}

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(log, "a") as f:
            f.write(json.dumps({{"args": args, "body": body}}) + "\\n")
        n = body["n_predict"]
        reply = {{"content": "x" * n, "tokens": [7] * n,
                 "timings": {{"predicted_per_second": 42.0, "prompt_per_second": 100.0, "prompt_ms": 30.0,
                             **({{"draft_n": 8, "draft_n_accepted": 6}} if has_draft else {{}})}}}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.fixture()
def fake_bin(tmp_path: Path) -> tuple[Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "requests.jsonl"
    server = bin_dir / "llama-server"
    server.write_text(STAND_IN.format(python=sys.executable, log=str(log)))
    server.chmod(server.stat().st_mode | stat.S_IEXEC)
    return bin_dir, log


def test_peers_send_token_ids_and_report_llama_timings(fake_bin, tmp_path):
    from specdec.bench.llamacpp import llamacpp_peers

    bin_dir, log = fake_bin
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    peers, close = llamacpp_peers(bin_dir, target, draft, params, num_tokens=3)
    try:
        assert set(peers) == {"llamacpp", "llamacpp-draft"}
        tokens, stats, text = peers["llamacpp"]([1, 2, 3])
        assert tokens == [7] * 9 and text == "x" * 9
        assert stats["tokens_per_s"] == 42.0 and stats["proposed_tokens"] == 0
        assert stats["ttft_s"] == pytest.approx(0.03)  # its prompt time: the report's TTFT column
        assert "mean_accepted_len" not in stats  # nothing drafted: no τ to report (the table shows 1)
        _, draft_stats, _ = peers["llamacpp-draft"]([1, 2, 3])
        assert draft_stats["acceptance_rate"] == pytest.approx(0.75)
        # 8 tokens after the first, 6 of them accepted drafts: 2 decode forwards, τ 4
        assert draft_stats["mean_accepted_len"] == pytest.approx(4.0)
    finally:
        close()
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert sent[0]["body"]["prompt"] == [1, 2, 3]  # token ids: both engines read identical prompts
    assert sent[0]["body"]["temperature"] == 0.0 and sent[0]["body"]["ignore_eos"] is True
    assert sent[0]["body"]["cache_prompt"] is False and sent[0]["body"]["min_p"] == 0.0  # llama's default 0.05 off
    assert "-md" in sent[1]["args"] and sent[1]["args"][sent[1]["args"].index("--spec-draft-n-max") + 1] == "3"


def test_missing_binary_and_non_gguf_models_are_clear_errors(tmp_path):
    from specdec.bench.llamacpp import llamacpp_peers

    with pytest.raises(SpecdecError, match="llama-server not found"):
        llamacpp_peers(tmp_path, tmp_path / "t.gguf", None, SamplingParams())
    with pytest.raises(SpecdecError, match="needs GGUF files"):
        llamacpp_peers(tmp_path, tmp_path / "model_dir", None, SamplingParams())


def test_server_that_dies_at_startup_is_reported(tmp_path):
    from specdec.bench.llamacpp import LlamaServer

    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n")
    server.chmod(0o755)
    with pytest.raises(SpecdecError, match="failed to load model"):
        LlamaServer(tmp_path, tmp_path / "t.gguf")


def test_first_server_is_stopped_when_the_draft_server_fails(fake_bin, tmp_path):
    from specdec.bench import llamacpp

    bin_dir, _ = fake_bin
    server = bin_dir / "llama-server"
    text = server.read_text().replace("has_draft = \"-md\" in args", "has_draft = \"-md\" in args\nif has_draft:\n    sys.exit('error: draft rejected')")
    server.write_text(text)
    started = []
    original = llamacpp.LlamaServer.__init__

    def spy(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        started.append(self)
        original(self, *args, **kwargs)

    llamacpp.LlamaServer.__init__ = spy
    try:
        with pytest.raises(SpecdecError, match="draft rejected"):
            llamacpp.llamacpp_peers(bin_dir, tmp_path / "t.gguf", tmp_path / "d.gguf", SamplingParams())
    finally:
        llamacpp.LlamaServer.__init__ = original
    assert started[0].process.poll() is not None  # the plain server was terminated
