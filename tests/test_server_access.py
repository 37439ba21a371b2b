"""Access control and limits of a real `specdec serve` on 127.0.0.1 (issue: API keys, body and token
limits, no request reaches the file system): every refusal is a 4xx with an OpenAI error object,
fast, and the server stays healthy."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from specdec.errors import SpecdecError
from specdec.server.security import AccessPolicy, load_api_keys
from tests.test_server import launch, serving

KEY, OTHER_KEY = "sk-test-0123456789", "sk-second-key"


def start(tiny_dirs, *extra: str, env: dict[str, str] | None = None):
    return launch("--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none",
                  "--served-model-name", "tiny", *extra, env=env)


@pytest.fixture(scope="module")
def keyed(tiny_dirs, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# team keys\n{OTHER_KEY}\n\n")
    proc, base = start(tiny_dirs, "--api-key", KEY, "--api-key-file", str(key_file), "--max-body-bytes", "65536",
                       "--max-prompt-tokens", "64", "--max-tokens-limit", "32")
    yield proc, base
    proc.terminate()
    proc.wait(timeout=30)


def post(base: str, path: str, body: dict | bytes, key: str | None = None, **kwargs) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    if isinstance(body, bytes):
        return httpx.post(f"{base}{path}", content=body, headers={**headers, "content-type": "application/json"},
                          timeout=30, **kwargs)
    return httpx.post(f"{base}{path}", json=body, headers=headers, timeout=30, **kwargs)


COMPLETION = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 4, "temperature": 0}


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code
    return error


def test_no_key_and_wrong_key_get_401_without_echoing_the_key(keyed):
    _, base = keyed
    for key in (None, "sk-wrong", KEY + "x", KEY[:-1]):
        start = time.perf_counter()
        response = post(base, "/v1/completions", COMPLETION, key=key)
        assert time.perf_counter() - start < 1.0
        error = assert_error(response, 401, "invalid_api_key")
        assert KEY not in response.text and (key or "§") not in error["message"]
    assert_error(httpx.get(f"{base}/v1/models", timeout=10), 401, "invalid_api_key")
    assert_error(httpx.get(f"{base}/v1/models", headers={"Authorization": f"Basic {KEY}"}, timeout=10), 401)
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200  # probes stay open
    metrics = httpx.get(f"{base}/metrics", timeout=10)
    assert metrics.status_code == 200 and 'specdec_refused_requests_total{reason="invalid_api_key"}' in metrics.text


def test_every_configured_key_works_through_the_openai_client(keyed):
    from openai import AuthenticationError, OpenAI

    _, base = keyed
    for key in (KEY, OTHER_KEY):
        client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        out = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=4, temperature=0)
        assert out.usage.completion_tokens >= 1
        pieces = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=4, temperature=0, stream=True))
        assert pieces and pieces[-1].choices[0].finish_reason in ("stop", "length")
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{base}/v1", api_key="sk-nope", max_retries=0).models.list()


def server_rss_kb(proc) -> int:  # noqa: ANN001 - subprocess.Popen
    for line in open(f"/proc/{proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_an_oversized_body_gets_413_before_it_is_read(keyed):
    proc, base = keyed
    before = server_rss_kb(proc)
    big = b'{"model": "tiny", "prompt": "' + b"x" * (64 * 1024 * 1024) + b'"}'  # 64 MiB, limit 64 KiB
    try:
        response = post(base, "/v1/completions", big, key=KEY)
        assert_error(response, 413, "request_too_large")
    except httpx.HTTPError:
        pass  # the server may close the connection while the client is still sending: also a refusal
    # streamed without a length (chunked): the limit holds without Content-Length too
    chunks = (b"x" * 65536 for _ in range(256))
    try:
        response = httpx.post(f"{base}/v1/completions", content=chunks, timeout=30,
                              headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json"})
        assert response.status_code == 413
    except httpx.HTTPError:
        pass
    assert server_rss_kb(proc) - before < 32 * 1024  # did not hold the 64 MiB body
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    assert post(base, "/v1/completions", COMPLETION, key=KEY).status_code == 200


def test_token_and_list_limits_answer_400_with_the_numbers(keyed):
    _, base = keyed
    error = assert_error(post(base, "/v1/completions", {**COMPLETION, "prompt": list(range(65))}, key=KEY), 400)
    assert "65" in error["message"] and "64" in error["message"]
    error = assert_error(post(base, "/v1/completions", {**COMPLETION, "max_tokens": 33}, key=KEY), 400)
    assert "33" in error["message"] and "32" in error["message"] and error["param"] == "max_tokens"
    chat_limit = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 40}
    error = assert_error(post(base, "/v1/chat/completions", chat_limit, key=KEY), 400)
    assert error["param"] == "max_completion_tokens" and error["message"].startswith("max_completion_tokens 40 exceeds")
    assert_error(post(base, "/v1/completions", {**COMPLETION, "stop": [str(i) for i in range(100)]}, key=KEY), 400)
    assert_error(post(base, "/v1/completions", {**COMPLETION, "stop": ["x" * 5000]}, key=KEY), 400)
    assert_error(post(base, "/v1/completions", {**COMPLETION, "logit_bias": {str(i): 1 for i in range(5000)}}, key=KEY), 400)
    # out-of-vocabulary ids and unknown chat roles: 400, not 500
    assert_error(post(base, "/v1/completions", {**COMPLETION, "prompt": [10_000_000, -5]}, key=KEY), 400)
    chat = {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 4}
    assert_error(post(base, "/v1/chat/completions", chat, key=KEY), 400)
    assert post(base, "/v1/completions", COMPLETION, key=KEY).status_code == 200


def test_no_request_field_reaches_the_file_system(keyed, tmp_path):
    """Paths in a request are refused; a FIFO stands for the path: opening it would block the server
    (so the request would time out) — every request here must come back at once."""
    _, base = keyed
    fifo = tmp_path / "trap"
    os.mkfifo(fifo)
    attempts = [
        ("/v1/completions", {**COMPLETION, "model": str(fifo)}, 404),
        ("/v1/completions", {**COMPLETION, "speculative": {"draft_model": str(fifo)}}, 400),
        ("/v1/completions", {**COMPLETION, "speculative": {"datastore": str(fifo)}}, 400),
        ("/v1/completions", {**COMPLETION, "speculative": {"method": "retrieval"}}, 400),
        ("/v1/completions", {**COMPLETION, "speculative": {"method": str(fifo)}}, 400),
        ("/v1/completions", {**COMPLETION, "speculative": {"drafter_path": str(fifo)}}, 400),
    ]
    for path, body, status in attempts:
        response = httpx.post(f"{base}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert_error(response, status)
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200


def test_metrics_can_require_the_key_and_the_environment_supplies_one(tiny_dirs):
    with serving(start(tiny_dirs, "--metrics-require-key", env={"SPECDEC_API_KEY": KEY})) as base:
        assert_error(httpx.get(f"{base}/metrics", timeout=10), 401, "invalid_api_key")
        assert httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).status_code == 200
        assert post(base, "/v1/completions", COMPLETION, key=KEY).status_code == 200
        assert httpx.get(f"{base}/health", timeout=10).status_code == 200


PREFLIGHT = {"Origin": "http://ui.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def test_browser_pages_may_call_the_server_as_they_call_vllm(keyed):
    """CORS with vLLM's defaults (any origin, method and header): a preflight is answered without the key (browsers
    send none with it; it was a 405), and answers — a 401 too — carry the header a page needs to read them."""
    _, base = keyed
    preflight = httpx.options(f"{base}/v1/chat/completions", headers=PREFLIGHT, timeout=10)
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    refused = httpx.get(f"{base}/v1/models", headers={"Origin": "http://ui.example"}, timeout=10)
    assert_error(refused, 401, "invalid_api_key")
    assert refused.headers["access-control-allow-origin"] == "*"
    answered = httpx.post(f"{base}/v1/completions", json=COMPLETION, timeout=30,
                          headers={"Authorization": f"Bearer {KEY}", "Origin": "http://ui.example"})
    assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == "*"
    assert httpx.get(f"{base}/ping", timeout=10).status_code == 200  # vLLM's health route, open like /health


def test_cors_origins_can_be_listed_or_switched_off(tiny_dirs):
    from fastapi import FastAPI

    from specdec.cli.values import string_list
    from specdec.server.security import CorsPolicy, add_cors

    with serving(start(tiny_dirs, "--allowed-origins", '["http://ui.example"]', "--allow-credentials")) as base:
        allowed = httpx.options(f"{base}/v1/completions", headers=PREFLIGHT, timeout=10)
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "http://ui.example"
        assert allowed.headers["access-control-allow-credentials"] == "true"
        other = httpx.options(f"{base}/v1/completions", headers={**PREFLIGHT, "Origin": "http://evil.example"}, timeout=10)
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        assert post(base, "/v1/completions", COMPLETION).status_code == 200  # clients that are not browsers: as before
    app = FastAPI()
    add_cors(app, CorsPolicy(allowed_origins=()))
    assert not app.user_middleware  # '--allowed-origins []': no CORS headers at all
    assert string_list("[]") == [] and string_list("a, b,") == ["a", "b"]
    assert string_list('["http://x:1", " "]') == ["http://x:1"]
    with pytest.raises(Exception, match="JSON list"):
        string_list('["a", 1]')


def test_key_sources_and_bad_configurations(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# comment\n a \n\nb\n")
    assert load_api_keys(["c"], str(keys), environ={"SPECDEC_API_KEY": "d"}) == ("c", "a", "b", "d")
    assert load_api_keys(None, None, environ={}) == ()
    with pytest.raises(SpecdecError, match="cannot read"):
        load_api_keys(None, str(tmp_path / "missing"), environ={})
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(SpecdecError, match="holds no key"):
        load_api_keys(None, str(tmp_path / "empty"), environ={})
    with pytest.raises(SpecdecError, match="empty"):
        load_api_keys([" "], None, environ={})
    with pytest.raises(SpecdecError, match="positive"):
        AccessPolicy(max_body_bytes=0)
    policy = AccessPolicy(api_keys=("k1", "k2"))
    assert policy.key_matches("Bearer k2") and policy.key_matches("bearer k1")
    assert not policy.key_matches("Bearer k3") and not policy.key_matches(None) and not policy.key_matches("Bearer ")
    assert policy.needs_key("/v1/completions") and not policy.needs_key("/health") and not policy.needs_key("/metrics")
    assert policy.needs_key("/reset_suffix_cache")
    assert policy.needs_key("/reset_prefix_cache")  # it changes the server: keyed like /v1/
    assert policy.needs_key("/tokenize") and policy.needs_key("/detokenize")  # they read the request's text


def test_a_missing_key_file_stops_the_server_with_a_clear_error(tiny_dirs, tmp_path):
    with pytest.raises(RuntimeError, match="api-key-file"):
        start(tiny_dirs, "--api-key-file", str(tmp_path / "nope.txt"))
