"""`specdec serve --ray --replicas 2`: a real local Ray cluster on loopback, two replicas of the tiny
pair behind Ray Serve's proxy; 20 concurrent requests, answers equal the library's (and so a single
process's), both replicas answered, errors and streams pass through, Ctrl-C stops everything."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
import pytest

import specdec
from specdec.sampling import SamplingParams
from tests.test_server import launch

pytestmark = pytest.mark.slow

PROMPTS = [f"def f{i}(x):\n    return x + {i}" for i in range(20)]


def _ray_or_skip() -> None:
    import importlib.util

    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        if os.environ.get("CI"):
            raise  # CI installs specdec[dev], which has ray[serve]: a skip there would hide a broken setup
        pytest.skip("ray[serve] is not installed (pip install 'specdec[ray]')")


@pytest.fixture(scope="module")
def ray_server(tiny_dirs):
    _ray_or_skip()
    proc, base = launch("--ray", "--replicas", "2", "--ray-cpus-per-replica", "1",
                        "--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]),
                        "--dtype", "float32", "--quantize", "none", "--served-model-name", "tiny",
                        "--num-speculative-tokens", "3", "--max-concurrency", "4", timeout_s=300)
    # /health answers as soon as one replica is up; wait until the proxy has routed to both
    seen: set[str] = set()
    deadline = time.time() + 180
    while len(seen) < 2 and time.time() < deadline and proc.poll() is None:
        seen.add(httpx.get(f"{base}/health", timeout=30).json()["instance"])
    yield proc, base
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)


def _complete(base: str, prompt: str) -> tuple[str, str]:
    response = httpx.post(f"{base}/v1/completions", timeout=120,
                          json={"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"], response.headers["x-specdec-instance"]


def test_two_replicas_serve_concurrent_requests_like_one_process(ray_server, tiny_target):
    _, base = ray_server
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda p: _complete(base, p), PROMPTS))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = [specdec.generate(tiny_target, prompt, params).text for prompt in PROMPTS]
    assert [text for text, _ in answers] == expected
    instances = {instance for _, instance in answers}
    assert len(instances) == 2, f"expected both replicas to answer, got {instances}"


def test_streams_and_errors_pass_through_the_proxy(ray_server, tiny_target):
    _, base = ray_server
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    import json

    streamed = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert streamed == specdec.generate(tiny_target, PROMPTS[0], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)).text
    bad = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": [10_000_000]}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{base}/health", timeout=30).status_code == 200
    # the client's x-request-id comes back once (Ray's proxy echoes it; ours beside it made two)
    traced = httpx.get(f"{base}/health", headers={"x-request-id": "myid-1"}, timeout=30)
    assert traced.headers.get_list("x-request-id") == ["myid-1"]


def test_sigint_stops_the_cluster(ray_server):
    proc, _ = ray_server
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 0
