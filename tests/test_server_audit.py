"""Online losslessness audit (`serve --audit-fraction`, per-request `"speculative": {"audit": true}`)
over real HTTP, and the auditor's mismatch path in process (an audit that could not fail would prove
nothing)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import httpx
import pytest

from specdec.config import DEFAULT_DRAFT_METHOD
from specdec.sampling import SamplingParams
from specdec.server.audit import AuditCase, Auditor
from specdec.server.executor import ModelExecutor
from specdec.server.metrics import Metrics
from tests.test_server import serving, start_server

GREEDY = {"model": "tiny", "prompt": "def fibonacci(n):", "max_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def audited(tiny_dirs):
    with serving(start_server(tiny_dirs, "--audit-fraction", "1.0")) as base:
        yield base


def audit_counts(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r'specdec_audit_total\{result="(\w+)"\} ([0-9.]+)', text)}


def test_a_request_can_ask_for_its_own_audit(audited):
    body = {**GREEDY, "speculative": {"audit": True}}
    out = httpx.post(f"{audited}/v1/completions", json=body, timeout=60).json()
    assert out["usage"]["speculative"]["audit"] == "identical"
    assert out["usage"]["speculative"]["method"] == DEFAULT_DRAFT_METHOD and out["usage"]["speculative"]["draft_tokens"] > 0
    with httpx.stream("POST", f"{audited}/v1/chat/completions", timeout=60,
                      json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                            "temperature": 0, "stream": True, "speculative": {"audit": True}}) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert events[-1]["usage"]["speculative"]["audit"] == "identical"


def test_an_audit_needs_greedy_decoding(audited):
    response = httpx.post(f"{audited}/v1/completions", json={**GREEDY, "temperature": 0.8, "speculative": {"audit": True}},
                          timeout=30)
    assert response.status_code == 400 and "temperature 0" in response.json()["error"]["message"]


def test_the_server_audits_finished_greedy_requests_when_idle(audited):
    before = audit_counts(audited).get("identical", 0.0)
    for prompt in ("import os\n", "class A:", "for i in range(3):"):
        assert httpx.post(f"{audited}/v1/completions", json={**GREEDY, "prompt": prompt}, timeout=60).status_code == 200
    sampled = httpx.post(f"{audited}/v1/completions", json={**GREEDY, "temperature": 0.9, "seed": 1}, timeout=60)
    assert sampled.status_code == 200  # sampled requests are not audited (one draw proves nothing)
    deadline = time.time() + 60
    while time.time() < deadline and audit_counts(audited).get("identical", 0.0) < before + 3:
        time.sleep(0.2)
    counts = audit_counts(audited)
    assert counts.get("identical", 0.0) == before + 3 and counts.get("mismatch", 0.0) == 0


def test_a_wrong_continuation_is_reported_and_logged(tiny_target, caplog):
    """The auditor itself: handed a continuation plain decoding would not produce, it says so."""
    executor, metrics = ModelExecutor(), Metrics()
    executor.enable_batching()
    auditor = Auditor(tiny_target, executor, metrics)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt = tiny_target.tokenizer.encode("def f(x):")

    async def run() -> tuple[str, str]:
        plain = await auditor._plain_ids(AuditCase("probe", prompt, params, []), interruptible=False)
        same = await auditor.audit_now(AuditCase("req-same", prompt, params, plain))
        wrong = await auditor.audit_now(AuditCase("req-wrong", prompt, params, plain[:-1] + [(plain[-1] + 1) % 100]))
        return same, wrong

    with caplog.at_level(logging.WARNING, logger="specdec.audit"):
        same, wrong = asyncio.run(run())
    assert (same, wrong) == ("identical", "mismatch")
    assert "req-wrong" in caplog.text and "at token 5" in caplog.text
    samples = {s.labels["result"]: s.value for s in metrics.audits.collect()[0].samples if s.name.endswith("_total")}
    assert samples == {"identical": 1.0, "mismatch": 1.0}


def test_the_fraction_is_checked():
    with pytest.raises(ValueError, match="audit-fraction"):
        Auditor(None, None, Metrics(), fraction=1.5)  # type: ignore[arg-type]
