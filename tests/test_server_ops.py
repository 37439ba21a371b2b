"""`specdec serve` as operators run it behind other services: null fields, headers on every response, request
logs, clients that give up while queued or mid-stream, nested JSON, the port checked before loading."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
import time

import httpx
import pytest

from tests.test_server import error, launch, serving, step_hook_server

#: `specdec serve` whose model thread sleeps 20 ms per streamed chunk, so one request holds the only slot for seconds
SLOW_SERVER = step_hook_server("""
def on_chunk(params, chunks):
    time.sleep(0.02)
""")


@pytest.fixture(scope="module")
def slow_server(tiny_dirs):
    """One slot, one queue place, request logs on; the process too, for its log."""
    proc, base = launch("--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none",
                        "--served-model-name", "tiny", "--max-concurrency", "1", "--max-queue", "1",
                        "--enable-log-requests", runner=("-c", SLOW_SERVER))
    with serving((proc, base)):
        yield proc, base


def test_null_means_the_default(slow_server):
    """Clients that send unset fields as null (OpenAI: "number or null") were refused with a 400."""
    _, base = slow_server
    nulls = {"temperature": None, "top_p": None, "n": None, "stream": None, "presence_penalty": None,
             "frequency_penalty": None, "max_tokens": 2}
    completion = httpx.post(f"{base}/v1/completions", json={"prompt": "x", "echo": None, **nulls}, timeout=60)
    assert completion.status_code == 200, completion.text
    assert len(completion.json()["choices"]) == 1
    chat = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], **nulls,
                                                            "logprobs": None}, timeout=60)
    assert chat.status_code == 200, chat.text


def test_every_response_names_the_instance_and_echoes_the_request_id(slow_server):
    """Only successful generations carried x-specdec-instance: errors, /health and /v1/models did not."""
    _, base = slow_server
    trace = {"x-request-id": "trace-123"}
    responses = [httpx.get(f"{base}/health", headers=trace), httpx.get(f"{base}/v1/models", headers=trace),
                 httpx.get(f"{base}/v1/nowhere", headers=trace),
                 httpx.post(f"{base}/v1/completions", json={"prompt": "x", "n": 0}, headers=trace)]
    assert [r.status_code for r in responses] == [200, 200, 404, 400]
    instance = responses[0].json()["instance"]
    for response in responses:
        assert response.headers["x-specdec-instance"] == instance
        assert response.headers["x-request-id"] == "trace-123"
    assert "x-request-id" not in httpx.get(f"{base}/health").headers
    assert httpx.head(f"{base}/health").status_code == 200  # a load balancer's HEAD probe was a 405


def test_deeply_nested_json_is_a_400_and_the_connection_stays_usable(slow_server):
    _, base = slow_server
    with httpx.Client(base_url=base, timeout=60) as client:
        body = '{"prompt": "x", "max_tokens": 2, "foo": ' + "[" * 5000 + "]" * 5000 + "}"
        refused = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert "nested too deeply" in error(refused, 400)["message"]
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200  # same connection


def test_include_usage_false_sends_no_usage(slow_server):
    _, base = slow_server
    body = {"prompt": "x", "max_tokens": 3, "stream": True, "n": 2}
    for options, chunks_with_usage in (({"include_usage": False}, 0), ({"include_usage": True}, 1), (None, 2)):
        with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream_options": options}, timeout=60) as response:
            events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert sum("usage" in json.loads(event) for event in events[:-1]) == chunks_with_usage, options


def metric(base: str, series: str) -> float:
    """One series' value on /metrics (0 before it is first counted)."""
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_clients_that_give_up_leave_the_queue_and_are_counted(slow_server):
    """A client that timed out while queued held its queue place (new clients got 429 queue_full) until a slot
    freed; a client that left mid-stream was missing from the request counts."""
    proc, base = slow_server
    gone = 'specdec_requests_total{endpoint="completions",status="499"}'
    before = metric(base, gone)
    long = {"prompt": "x", "max_tokens": 300, "ignore_eos": True, "temperature": 0, "stream": True}
    first_event = threading.Event()

    def hold_the_slot() -> None:
        with httpx.stream("POST", f"{base}/v1/completions", json=long, timeout=60) as response:
            for index, _ in enumerate(response.iter_lines()):
                first_event.set()
                if index == 40:
                    break  # hang up mid-stream, ~1 s in

    holder = threading.Thread(target=hold_the_slot)
    holder.start()
    assert first_event.wait(30)
    with pytest.raises(httpx.ReadTimeout):  # queued behind the holder; gives up
        httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=0.3)
    deadline = time.time() + 3
    while time.time() < deadline and httpx.get(f"{base}/health").json()["waiting"] != 0:
        time.sleep(0.05)
    health = httpx.get(f"{base}/health").json()
    assert health["waiting"] == 0 and health["active"] == 1  # left the queue while the holder still runs
    holder.join(30)
    deadline = time.time() + 5
    while time.time() < deadline and metric(base, gone) < before + 2:
        time.sleep(0.1)
    assert metric(base, gone) == before + 2  # the queued one and the stream


def test_an_admitted_requests_later_choices_do_not_fill_the_queue(slow_server):
    """--max-queue counts requests: an n=3 request on the one slot held the one queue place with its own later
    choices, so the next request was refused at once with nothing else waiting. A refusal says when to retry."""
    proc, base = slow_server

    def wait_for(waiting: int) -> None:
        deadline = time.time() + 10
        while time.time() < deadline and httpx.get(f"{base}/health").json()["waiting"] != waiting:
            time.sleep(0.02)
        assert httpx.get(f"{base}/health").json()["waiting"] == waiting

    body = {"prompt": "x", "max_tokens": 60, "ignore_eos": True, "temperature": 0}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        three = pool.submit(httpx.post, f"{base}/v1/completions", json={**body, "n": 3}, timeout=60)
        wait_for(1)  # its first choice on the slot, the second waiting for it (the third asks once that one runs)
        queued = pool.submit(httpx.post, f"{base}/v1/completions", json=body, timeout=60)
        wait_for(2)  # the queue's one place taken by a request
        refused = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert error(refused, 429)["code"] == "queue_full"
        assert refused.headers["retry-after"] == "1"
        assert three.result().status_code == 200 and len(three.result().json()["choices"]) == 3
        assert queued.result().status_code == 200, queued.result().text


def test_a_stream_with_more_choices_than_slots_starts_with_its_first_choice(slow_server):
    """n=3 on one slot: the later choices wait for the earlier ones, but the stream started only once the last had a
    slot, so the first choice's tokens arrived in one burst after two choices' time. Now they stream as made."""
    _, base = slow_server
    body = {"prompt": "x", "max_tokens": 40, "ignore_eos": True, "temperature": 0, "stream": True, "n": 3}
    arrivals: list[tuple[float, int, str | None]] = []
    start = time.perf_counter()
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[len("data: "):])["choices"][0]
                arrivals.append((time.perf_counter() - start, choice["index"], choice["finish_reason"]))
    ends = {index: at for at, index, reason in arrivals if reason is not None}
    assert sorted(ends) == [0, 1, 2]
    first_text_of = {index: min(at for at, i, _ in arrivals if i == index) for index in ends}
    assert first_text_of[0] < ends[0] / 2  # the first choice streams as it is made (it took ~0.8 s alone)
    assert first_text_of[1] >= ends[0] - 0.05 and first_text_of[2] >= ends[1] - 0.05  # one slot: one after another
    assert sum(index == 1 for _, index, _ in arrivals) > 5  # and the later ones stream too


def test_a_stream_left_while_its_later_choices_wait_frees_every_slot(slow_server):
    """The later choices of a stream open in the background: a client that leaves during the first choice leaves
    nothing behind — no choice waiting for the slot, none generating for nobody."""
    _, base = slow_server
    body = {"prompt": "x", "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True, "n": 3}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
        for index, _ in enumerate(response.iter_lines()):
            if index == 10:
                assert httpx.get(f"{base}/health").json()["waiting"] == 1  # the second choice, for the one slot
                break
    deadline = time.time() + 5
    while time.time() < deadline and httpx.get(f"{base}/health").json()["active"] != 0:
        time.sleep(0.05)
    health = httpx.get(f"{base}/health").json()
    assert (health["active"], health["waiting"]) == (0, 0)
    served = httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
    assert served.status_code == 200


#: one slot, 20 ms a chunk; a choice seeded 101 cannot open (a SpecdecError where its generation is set up)
REFUSING_SERVER = step_hook_server("""
from specdec.errors import SpecdecError
stepping = jobs.generate_steps

def refusing(**kwargs):
    if kwargs["params"].seed == 101:
        raise SpecdecError("temperature is refused here: injected for seed 101")
    return stepping(**kwargs)

jobs.generate_steps = refusing

def on_chunk(params, chunks):
    time.sleep(0.02)
""")


def test_a_streamed_choice_that_cannot_open_later_is_the_requests_error_in_the_stream(tiny_dirs):
    """A stream's choice opened in the background once a slot freed: its refusal comes as the 400 error object it
    would have been before the response (status and param), then [DONE]; the slots are free after it."""
    proc, base = launch("--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none",
                        "--served-model-name", "tiny", "--max-concurrency", "1", runner=("-c", REFUSING_SERVER))
    with serving((proc, base)):
        body = {"prompt": "x", "max_tokens": 20, "ignore_eos": True, "temperature": 0.5, "seed": 100, "n": 3, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", "temperature"), error
        assert "injected for seed 101" in error["message"]
        assert any(json.loads(event).get("choices", [{}])[0].get("index") == 0 for event in events[:-2])  # it streamed
        deadline = time.time() + 5
        while time.time() < deadline and httpx.get(f"{base}/health").json()["active"] != 0:
            time.sleep(0.05)
        health = httpx.get(f"{base}/health").json()
        assert (health["active"], health["waiting"]) == (0, 0)


def test_the_request_log_has_one_line_per_request(tiny_dirs):
    proc, base = launch("--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none",
                        "--served-model-name", "tiny", "--enable-log-requests", "--max-log-len", "100")
    with serving((proc, base)):
        httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers={"x-request-id": "abc"}, timeout=60)
        httpx.post(f"{base}/v1/completions", json={"prompt": "x", "n": 0}, timeout=60)
        httpx.post(f"{base}/v1/completions", json={"prompt": "y" * 300, "max_tokens": 1, "temperature": 0.5, "n": 2,
                                                   "speculative": {"method": "ngram", "num_speculative_tokens": 3}},
                   timeout=60)
    log = proc.stderr.read()
    assert '"POST /v1/completions" 200' in log and "request_id=abc" in log
    assert '"POST /v1/completions" 400' in log
    # on admission, what each request asked for (vLLM's "Received request" line): its prompt as the model reads it,
    # cut at --max-log-len, the sampling parameters that are not defaults, n and the speculation
    assert "request_id=abc completions: 'x' (1 token) max_tokens=2 n=1; plain decoding" in log
    long_line = next(line for line in log.splitlines() if "'yyy" in line)
    assert "'" + "y" * 100 + "'…(+200 characters; 300 tokens)" in long_line
    assert "temperature=0.5" in long_line and "n=2; ngram γ=3" in long_line


def test_max_log_len_0_logs_no_user_text():
    """--max-log-len 0 showed the prompt as '' (an empty prompt, it read) and stop strings or a prediction whole."""
    from specdec.sampling import SamplingParams
    from specdec.server.request_log import content_line

    params = SamplingParams(temperature=0.5, stop=["secret"], prediction="secret too")
    line = content_line("r1", "chat", [("secret prompt", 3)], 1, params, "plain decoding", 0)
    assert line == "request_id=r1 chat: (3 tokens) temperature=0.5 stop=… prediction=… n=1; plain decoding"
    whole = content_line(None, "completions", [("secret prompt", 1)], 2, params, "ngram γ=3", None)
    assert whole == ("completions: 'secret prompt' (1 token) temperature=0.5 stop=['secret'] prediction='secret too' "
                     "n=2; ngram γ=3")


def test_a_port_in_use_is_refused_before_loading(tmp_path):
    from tests.test_cli import run_cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.time()
        proc = run_cli("serve", "--port", str(port), "--model", str(tmp_path / "never-loaded.gguf"))
    assert proc.returncode == 1 and f"error: cannot listen on 127.0.0.1:{port}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and time.time() - start < 60


def test_openapi_describes_the_request_bodies(slow_server):
    """/docs listed no request body for any POST route (the routes parse the body themselves)."""
    _, base = slow_server
    document = httpx.get(f"{base}/openapi.json").json()
    for path, model in (("/v1/completions", "CompletionRequest"), ("/v1/chat/completions", "ChatCompletionRequest")):
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
    assert "temperature" in document["components"]["schemas"]["CompletionRequest"]["properties"]
    assert "ChatMessage" in document["components"]["schemas"]


def test_the_request_log_says_499_for_a_stream_its_client_cut(caplog):
    """A streamed response sends its 200 status line first; the log line said 200 for a stream the client cut,
    while /metrics counted it as 499."""
    import asyncio
    import logging

    from specdec.server.request_log import ResponseHeaders

    async def streaming_app(scope, receive, send, cut: bool):  # noqa: ANN001, ANN202
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        if cut:
            assert (await receive())["type"] == "http.disconnect"
            return
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def run(cut: bool) -> None:
        messages = [{"type": "http.request", "body": b"", "more_body": False}, {"type": "http.disconnect"}]

        async def receive():  # noqa: ANN202
            return messages.pop(0) if len(messages) > 1 else messages[0]

        async def send(message):  # noqa: ANN001, ANN202
            pass

        app = ResponseHeaders(lambda scope, rcv, snd: streaming_app(scope, rcv, snd, cut), "test", log_requests=True)
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "client": ("127.0.0.1", 1)}
        if cut:
            await receive()  # the request body was read before the stream started
        await app(scope, receive, send)

    with caplog.at_level(logging.INFO, logger="specdec.server.requests"):
        asyncio.run(run(cut=True))
        asyncio.run(run(cut=False))
    lines = [record.getMessage() for record in caplog.records]
    assert '"POST /v1/completions" 499' in lines[0] and '"POST /v1/completions" 200' in lines[1]


def test_under_ray_the_request_id_is_echoed_once():
    """Ray Serve's proxy echoes the client's x-request-id itself: with ours too, a --ray response carried it twice
    (clients that merge repeated headers read "myid-1, myid-1")."""
    import asyncio

    from specdec.server.request_log import ResponseHeaders

    async def app(scope, receive, send):  # noqa: ANN001, ANN202
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    def headers(echo: bool) -> list[tuple[bytes, bytes]]:
        sent: list[dict] = []

        async def receive():  # noqa: ANN202
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):  # noqa: ANN001, ANN202
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/health", "headers": [(b"x-request-id", b"myid-1")]}
        asyncio.run(ResponseHeaders(app, "test", echo_request_id=echo)(scope, receive, send))
        return sent[0]["headers"]

    assert (b"x-request-id", b"myid-1") in headers(True)
    assert all(name != b"x-request-id" for name, _ in headers(False))


def test_a_working_server_logs_its_throughput_every_interval(tiny_dirs):
    """vLLM's periodic line: an operator watching the terminal saw nothing while the server worked. Each line
    counts the tokens of its own window (chunks as they come, not requests as they end), the weights read per
    second, the load and the drafts accepted; an idle server says nothing, and --disable-log-stats none."""
    import re
    import signal

    proc, base = launch("--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]), "--dtype",
                        "float32", "--quantize", "none", "--served-model-name", "tiny", "--log-stats-interval", "0.2",
                        runner=("-c", SLOW_SERVER))
    with serving((proc, base)):
        started = time.time()
        answer = httpx.post(f"{base}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 60, "ignore_eos": True,
                                                            "temperature": 0}, timeout=120)
        working_s = time.time() - started
        assert answer.status_code == 200
        time.sleep(1.0)  # idle windows: no lines
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    lines = [line for line in stderr.splitlines() if "specdec.server.stats" in line]
    pattern = re.compile(r"INFO specdec\.server\.stats: throughput: generation ([\d.]+) tok/s, prompt ([\d.]+) tok/s, "
                         r"weights read ([\d.]+) GB/s; running (\d+), waiting (\d+)(; draft acceptance [\d.]+ % "
                         r"\((\d+) of (\d+) drafted tokens\))?$")
    parsed = [pattern.match(line) for line in lines]
    assert lines and all(parsed), stderr[-3000:]
    assert len(lines) >= 3  # ~60 chunks x 20 ms: a line every 0.2 s of it
    assert sum(float(one[1]) > 0 for one in parsed) >= 2 and any(one[4] == "1" for one in parsed)
    assert any(float(one[3]) > 0 for one in parsed) and any(one[6] for one in parsed)
    assert sum(int(one[7]) for one in parsed if one[6]) <= sum(int(one[8]) for one in parsed if one[6])
    assert len(lines) <= working_s / 0.2 + 2, lines  # nothing logged in the idle second after the answer

    quiet, quiet_base = launch("--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none",
                               "--served-model-name", "tiny", "--log-stats-interval", "0.2", "--disable-log-stats")
    with serving((quiet, quiet_base)):
        httpx.post(f"{quiet_base}/v1/completions", json={"prompt": "x", "max_tokens": 30}, timeout=60)
        time.sleep(0.5)
        quiet.send_signal(signal.SIGINT)
        _, stderr = quiet.communicate(timeout=60)
    assert "specdec.server.stats" not in stderr, stderr[-2000:]


def test_the_throughput_window_counts_what_was_computed_and_says_nothing_when_idle():
    """Prompt rows of the target's forwards only (a draft model's catch-up and a prefix cache's hits are not prompt
    throughput), weights once per time the backend read them (float weights run a batch's calls one by one)."""
    from specdec.forward_costs import Forward
    from specdec.server.stats_log import ThroughputWindow, stats_line
    from specdec.stats import Round

    class Backend:
        weight_bytes = 10**9

    window = ThroughputWindow()
    assert stats_line(window.take(), 1.0, 0, 0) is None
    window.add_forward(Forward(Backend(), "target", 2, 40, 1, 0.1, prompt_rows=38, weight_passes=2))
    window.add_forward(Forward(Backend(), "draft", 1, 30, 1, 0.1, prompt_rows=30))
    window.add_chunk(3, [Round(drafted=[1, 2, 3], accepted=2, forced=0, committed=[1, 2, 9])])
    line = stats_line(window.take(), 2.0, 1, 1)
    assert line == ("throughput: generation 1.5 tok/s, prompt 19.0 tok/s, weights read 1.50 GB/s; running 1, waiting 1; "
                    "draft acceptance 66.7 % (2 of 3 drafted tokens)")
    assert stats_line(window.take(), 2.0, 0, 0) is None  # a fresh window


def test_the_stats_interval_flag_takes_zero_or_a_tenth_of_a_second_and_more(capsys):
    """A tiny interval was a busy loop flooding the log: refused in one line, as a negative or non-number is."""
    from specdec.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve"]).log_stats_interval == 10.0
    assert parser.parse_args(["serve", "--log-stats-interval", "0"]).log_stats_interval == 0.0
    assert parser.parse_args(["serve", "--log-stats-interval", "0.5"]).log_stats_interval == 0.5
    for bad in ("0.01", "-1", "nan", "inf", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--log-stats-interval", bad])
        assert "--log-stats-interval" in capsys.readouterr().err
