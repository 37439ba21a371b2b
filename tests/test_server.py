"""A real `specdec serve` process on 127.0.0.1 with a tiny model, driven by the openai client."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

import specdec
from specdec.config import DEFAULT_DRAFT_METHOD
from specdec.sampling import SamplingParams


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120,
           runner: tuple[str, ...] = ("-m", "specdec.cli")):
    """Start `specdec serve ARGS` on a free loopback port (``env``: extra environment variables;
    ``runner``: how Python starts the CLI); return (process, base URL) once healthy."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, *runner, "serve", "--port", str(port), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read())
    return proc, base


@contextlib.contextmanager
def serving(started):  # noqa: ANN001, ANN201 - (Popen, str) from launch() or start_server()
    """A started server for a with-block: its base URL, the process stopped at the end."""
    proc, base = started
    try:
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def start_server(tiny_dirs, *extra: str):
    return launch("--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]), "--dtype", "float32",
                  "--quantize", "none", "--served-model-name", "tiny", "--num-speculative-tokens", "3", *extra)


@pytest.fixture(scope="module")
def server(tiny_dirs):
    with serving(start_server(tiny_dirs, "--max-concurrency", "4", "--max-queue", "100")) as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def test_completion_equals_library_greedy(client, tiny_target):
    out = client.completions.create(model="tiny", prompt="def fibonacci(n):", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    expected = specdec.generate(tiny_target, "def fibonacci(n):", SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert out.choices[0].text == expected.text
    usage = out.usage.model_dump()
    assert usage["completion_tokens"] == 16 and usage["speculative"]["method"] == DEFAULT_DRAFT_METHOD


def test_penalties_and_logit_bias_equal_library_greedy(client, tiny_target):
    """OpenAI's presence/frequency penalties and logit_bias, vLLM's repetition_penalty: the server
    speculates (its default drafter) and still answers what plain decoding with them gives."""
    penalties = dict(presence_penalty=0.4, frequency_penalty=0.6)
    out = client.completions.create(model="tiny", prompt="for i in range(10):", max_tokens=24, temperature=0,
                                    logit_bias={"7": -100}, **penalties,
                                    extra_body={"ignore_eos": True, "repetition_penalty": 1.3, "min_tokens": 4,
                                                "stop_token_ids": [9]})
    expected = specdec.generate(tiny_target, "for i in range(10):", SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True, logit_bias={7: -100.0}, repetition_penalty=1.3, min_tokens=4,
        stop_token_ids=[9], **penalties))
    assert out.choices[0].text == expected.text
    assert out.usage.model_dump()["speculative"]["method"] == DEFAULT_DRAFT_METHOD


def test_skip_special_tokens_and_chat_template_kwargs_are_read(client, server, tiny_target):
    """vLLM's two request fields were accepted and ignored: a generated special token stayed out of the text whatever
    the request said, and template variables never reached the template."""
    import httpx

    body = dict(model="tiny", prompt="x", max_tokens=3, temperature=0, logit_bias={"1": 100},
                extra_body={"ignore_eos": True})  # token 1: <|im_start|>, special, not a stop token
    assert "<|im_start|>" not in client.completions.create(**body).choices[0].text
    shown = client.completions.create(**{**body, "extra_body": {"ignore_eos": True, "skip_special_tokens": False}})
    assert shown.choices[0].text == "<|im_start|>" * 3
    expected = specdec.generate(tiny_target, "x", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True,
                                                                logit_bias={1: 100.0}, skip_special_tokens=False))
    assert shown.choices[0].text == expected.text
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ok = httpx.post(f"{server}/v1/chat/completions", json={**chat, "chat_template_kwargs": {"enable_thinking": False}})
    assert ok.status_code == 200, ok.text
    refused = httpx.post(f"{server}/v1/chat/completions", json={**chat, "chat_template_kwargs": {"tools": []}})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "chat_template_kwargs"


def test_n_choices_are_the_seeded_requests_seed_plus_index(client, server):
    """``n`` choices step side by side; choice i is what a single request with seed + i answers
    (seeded sampling does not depend on its batch), greedy choices are all the plain text."""
    body = dict(model="tiny", prompt="def add(a, b):", max_tokens=12, temperature=1.0, extra_body={"ignore_eos": True})
    many = client.completions.create(n=3, seed=7, **body)
    assert [c.index for c in many.choices] == [0, 1, 2]
    for i, choice in enumerate(many.choices):
        assert choice.text == client.completions.create(seed=7 + i, **body).choices[0].text
    assert len({c.text for c in many.choices}) > 1
    usage = many.usage.model_dump()
    assert usage["completion_tokens"] == 36 and len(usage["speculative"]["choices"]) == 3
    each = usage["speculative"]["choices"]
    assert usage["speculative"]["draft_tokens"] == sum(c["draft_tokens"] for c in each)
    assert usage["speculative"]["ttft_s"] == max(c["ttft_s"] for c in each)
    assert min(c["mean_accepted_len"] for c in each) <= usage["speculative"]["mean_accepted_len"] <= max(c["mean_accepted_len"] for c in each)
    greedy = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2,
                                            max_tokens=8, temperature=0)
    single = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                            temperature=0)
    assert [c.message.content for c in greedy.choices] == [single.choices[0].message.content] * 2
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(n=3, seed=7, stream=True, **body):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {i: c.text for i, c in enumerate(many.choices)}
    chunks = list(client.completions.create(n=3, seed=7, stream=True, stream_options={"include_usage": True}, **body))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 36  # OpenAI's last chunk: the request's usage
    assert all(chunk.usage is None for chunk in chunks[:-1])  # a client summing the chunks' usage counted choices twice
    response = httpx.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": "x", "n": 17})
    assert response.status_code == 400 and "n must be in 1..16" in response.json()["error"]["message"]
    more = httpx.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": "x", "n": 5, "max_tokens": 4}, timeout=60)
    assert more.status_code == 200 and len(more.json()["choices"]) == 5  # over --max-concurrency 4: the 5th waits
    assert httpx.get(f"{server}/health").status_code == 200


def test_a_list_of_prompts_answers_each_in_order(client, server, tiny_target):
    """OpenAI's batch form of completions: n choices for each prompt, by prompt then choice."""
    prompts = ["def add(a, b):", "import os"]
    ids = tiny_target.tokenizer.encode("for i in")
    out = client.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    expected = [specdec.generate(tiny_target, p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)) for p in prompts]
    assert [c.text for c in out.choices] == [expected[0].text] * 2 + [expected[1].text] * 2
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    usage = out.usage.model_dump()
    assert usage["prompt_tokens"] == sum(len(e.prompt_ids) for e in expected) and usage["completion_tokens"] == 24
    as_ids = client.completions.create(model="tiny", prompt=[ids, ids], max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    single = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert [c.text for c in as_ids.choices] == [single.choices[0].text] * 2
    # 6 choices on --max-concurrency 4 (a 400 once): the last two wait for slots, answered in order
    many = client.completions.create(model="tiny", prompt=["a", "b", "c"], n=2, max_tokens=4, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert [c.index for c in many.choices] == list(range(6)) and many.choices[4].text == many.choices[5].text
    assert httpx.get(f"{server}/health").json()["active"] == 0
    mixed = httpx.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": ["a", [1, 2]]})
    assert mixed.status_code == 400


def test_streamed_completion_and_chat(client, tiny_target):
    pieces = [c.choices[0].text for c in client.completions.create(model="tiny", prompt="for i in", max_tokens=12, temperature=0,
                                                                    stream=True, extra_body={"ignore_eos": True})]
    expected = specdec.generate(tiny_target, "for i in", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert "".join(pieces) == expected.text
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=10, temperature=0)
    streamed = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=10,
                                              temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed)
    assert text == chat.choices[0].message.content
    reference = specdec.generate(tiny_target, [{"role": "user", "content": "hi"}], SamplingParams(temperature=0, max_tokens=10))
    assert chat.choices[0].message.content == reference.text


def test_speculative_override_and_disable(server):
    body = {"model": "tiny", "prompt": "a a a a a a", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    plain = httpx.post(f"{server}/v1/completions", json={**body, "speculative": None}, timeout=60).json()
    ngram = httpx.post(f"{server}/v1/completions", json={**body, "speculative": {"method": "ngram", "num_speculative_tokens": 2}}, timeout=60).json()
    assert plain["usage"]["speculative"]["method"] == "ar"
    assert ngram["usage"]["speculative"]["method"] == "ngram"
    assert plain["choices"][0]["text"] == ngram["choices"][0]["text"]


def test_concurrent_requests_equal_sequential(server):
    def request(i: int) -> str:
        body = {"model": "tiny", "prompt": f"request {i}:", "max_tokens": 10, "temperature": 0.8, "seed": i, "ignore_eos": True}
        return httpx.post(f"{server}/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]

    sequential = [request(i) for i in range(50)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        concurrent_texts = list(pool.map(request, range(50)))
    assert concurrent_texts == sequential
    metrics = httpx.get(f"{server}/metrics").text
    assert 'specdec_requests_total{endpoint="completions",status="200"}' in metrics
    assert "specdec_spec_decode_num_draft_tokens_total" in metrics
    resident = next(line for line in metrics.splitlines() if line.startswith("process_resident_memory_bytes "))
    assert float(resident.split()[1]) > 50e6  # this process's RSS (the tiny models and torch)


@pytest.mark.parametrize("payload,status,fragment", [
    (b"{not json", 400, "malformed JSON"),
    ({"model": "tiny"}, 400, "prompt"),
    ({"model": "other", "prompt": "x"}, 404, "not found"),
    ({"model": "tiny", "prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"model": "tiny", "prompt": "x", "top_p": 2}, 400, "top_p"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 100000}, 400, "context window"),
    ({"model": "tiny", "prompt": "x", "speculative": {"method": "telepathy"}}, 400, "unknown speculative method"),
    ({"model": "tiny", "prompt": "x", "speculative": {"num_speculative_tokens": 0}}, 400, ">= 1"),
    ({"model": "tiny", "prompt": "x", "frequency_penalty": 3}, 400, "frequency_penalty must be a number in [-2, 2]"),
    ({"model": "tiny", "prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty must be a finite number > 0"),
    ({"model": "tiny", "prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias keys must be token ids"),
    ({"model": "tiny", "prompt": "x", "logit_bias": {"²": 1}}, 400, "logit_bias keys must be token ids"),
    ({"model": "tiny", "prompt": "x", "logit_bias": {"3": 500}}, 400, "logit_bias values must be numbers in [-100, 100]"),
    ({"model": "tiny", "prompt": "x", "logit_bias": {"99999999": 1}}, 400, "outside the vocabulary"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 4, "min_tokens": 9}, 400, "min_tokens must be an integer in [0, max_tokens = 4]"),
    ({"model": "tiny", "prompt": "x", "stop_token_ids": list(range(300))}, 400, "stop_token_ids: at most 256"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens must be an integer >= 1, got 0"),
    (b'{"model": "tiny", "prompt": "caf\\ud800 x", "max_tokens": 2}', 400, "lone surrogate"),
])
def test_bad_input_gets_error_object_and_server_stays_up(server, payload, status, fragment):
    url = f"{server}/v1/completions"
    response = httpx.post(url, content=payload, headers={"content-type": "application/json"}) if isinstance(payload, bytes) \
        else httpx.post(url, json=payload)
    assert response.status_code == status
    error = response.json()["error"]
    assert fragment in error["message"] and "type" in error
    assert httpx.get(f"{server}/health").status_code == 200


def test_errors_name_their_field_and_every_route_answers_openai_errors(server):
    """The walkthrough's findings: a 0 that fell back to the default length, an unpaired surrogate escape that
    was a 500 in plain text, FastAPI's own 404/405 shapes, an image part reported as "not a string", an
    empty prompt coded as too long, and top_logprobs reported as logprobs."""
    chat = f"{server}/v1/chat/completions"
    user = [{"role": "user", "content": "hi"}]
    zero = error(httpx.post(chat, json={"model": "tiny", "messages": user, "max_completion_tokens": 0}), 400)
    assert zero["param"] == "max_completion_tokens" and ">= 1" in zero["message"]
    scored = error(httpx.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 0,
                                                               "echo": True, "logprobs": 1}), 400)
    assert "echo with logprobs and max_tokens 1" in scored["message"]
    top = error(httpx.post(chat, json={"model": "tiny", "messages": user, "logprobs": True, "top_logprobs": 50}), 400)
    assert top["param"] == "top_logprobs" and "top_logprobs must be" in top["message"]
    image = error(httpx.post(chat, json={"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}), 400)
    assert "'image_url'" in image["message"] and "text parts only" in image["message"]
    assert image["param"] == "messages.0.content.0"
    for url, body in ((chat, b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}]}'),
                      (f"{server}/tokenize", b'{"prompt": "\\ud800"}')):
        broken = error(httpx.post(url, content=body, headers={"content-type": "application/json"}), 400)
        assert "lone surrogate" in broken["message"]
    # a prompt that fills the context names the field that holds it and no max_tokens the client never sent
    full = error(httpx.post(chat, json={"model": "tiny", "messages": [{"role": "user", "content": "a b " * 600}]}), 400)
    assert full["param"] == "messages" and full["code"] == "context_length_exceeded"
    assert "no room for a completion" in full["message"] and "max_tokens" not in full["message"]
    long = error(httpx.post(chat, json={"model": "tiny", "messages": user, "max_tokens": 100000}), 400)
    assert long["param"] == "messages" and "context window" in long["message"]
    ids = error(httpx.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": [5] * 512}), 400)
    assert ids["param"] == "prompt" and "no room for a completion" in ids["message"]
    # /tokenize reads a completion request's own body (its other fields logged and ignored, as on /v1)
    counted = httpx.post(f"{server}/tokenize", json={"model": "tiny", "messages": user, "max_tokens": 5, "temperature": 0})
    assert counted.status_code == 200 and counted.json()["count"] > 0
    empty = error(httpx.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": ""}), 400)
    assert empty["code"] != "context_length_exceeded" and "empty" in empty["message"]
    assert "GET" in error(httpx.get(f"{server}/v1/completions"), 405)["message"]
    assert "/v1/nothing" in error(httpx.post(f"{server}/v1/nothing", json={}), 404)["message"]
    assert httpx.get(f"{server}/health").status_code == 200


def error(response: httpx.Response, status: int) -> dict:
    """The OpenAI error object of a response that must have ``status``."""
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_cancelled_stream_frees_its_slot(server):
    """Disconnect mid-stream from a long request; the slot must be free again soon after."""
    body = {"model": "tiny", "prompt": "long", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as response:
        for _ in response.iter_lines():
            break  # first event, then hang up
    deadline = time.time() + 10
    while time.time() < deadline and httpx.get(f"{server}/health").json()["active"] != 0:
        time.sleep(0.1)
    assert httpx.get(f"{server}/health").json()["active"] == 0


def test_full_queue_is_429_and_server_recovers(tiny_dirs):
    with serving(start_server(tiny_dirs, "--max-concurrency", "1", "--max-queue", "0")) as base:
        body = {"model": "tiny", "prompt": "long", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            responses = list(pool.map(lambda _: httpx.post(f"{base}/v1/completions", json=body, timeout=60), range(8)))
        codes = sorted(r.status_code for r in responses)
        assert 200 in codes and 429 in codes, codes  # one slot, no queue: the rest are turned away
        busy = next(r for r in responses if r.status_code == 429)
        assert busy.json()["error"]["code"] == "queue_full"
        deadline = time.time() + 10
        while time.time() < deadline:
            ok = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2}, timeout=30)
            if ok.status_code == 200:
                break
            time.sleep(0.2)
        assert ok.status_code == 200
        for stream in (False, True):  # two prompts on one slot and no queue: the second waits for the first
            pair = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": ["a", "b"], "max_tokens": 3,
                                                               "stream": stream}, timeout=60)
            assert pair.status_code == 200 and (pair.text.count('"index": 1') if stream else len(pair.json()["choices"]) == 2)
        assert httpx.get(f"{base}/health").json()["active"] == 0


def test_server_flags_apply_to_every_method_per_request(tiny_dirs, tiny_target):
    """`serve --method draft_suffix --draft-vocab-size N` (make run's configuration) answers with
    draft_suffix, the server's --draft-vocab-size reaches each request (its counts are the
    library's with that setting, not without it), and a request may switch method by alias."""
    from specdec.drafters.suffix import clear_global_caches

    draft = tiny_target  # the target as its own draft: every token accepted, unless the draft vocabulary is cut
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = "def fibonacci(n):"

    def library(vocab: int):  # noqa: ANN202
        clear_global_caches()  # the fresh server's suffix cache is empty too
        # chains: a tree's size follows measured verify times, so its counts would vary between runs
        spec = specdec.SpecConfig(method="draft_suffix", num_speculative_tokens=3, draft_vocab_size=vocab, spec_tree="off")
        return specdec.generate(tiny_target, prompt, params, draft=draft, spec=spec)

    with_limit, without_limit = library(40), library(0)
    assert (with_limit.stats.proposed_tokens, with_limit.stats.accepted_tokens) != (
        without_limit.stats.proposed_tokens, without_limit.stats.accepted_tokens)  # the flag is observable
    with serving(launch("--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["target"]), "--dtype", "float32",
                        "--quantize", "none", "--served-model-name", "tiny", "--num-speculative-tokens", "3",
                        "--method", "draft_suffix", "--draft-vocab-size", "40", "--spec-tree", "off")) as base:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        answer = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]["speculative"]
        assert answer.json()["choices"][0]["text"] == with_limit.text
        assert usage["method"] == "draft_suffix"
        assert (usage["draft_tokens"], usage["accepted_tokens"]) == (with_limit.stats.proposed_tokens,
                                                                     with_limit.stats.accepted_tokens)
        switched = httpx.post(f"{base}/v1/completions", json={**body, "speculative": {"method": "prompt-lookup"}}, timeout=60)
        assert switched.status_code == 200 and switched.json()["usage"]["speculative"]["method"] == "ngram"
        unknown = httpx.post(f"{base}/v1/completions", json={**body, "speculative": {"method": "telepathy"}}, timeout=60)
        assert unknown.status_code == 400 and "unknown speculative method" in unknown.json()["error"]["message"]


def test_server_without_draft_model_refuses_draft_methods_per_request(tiny_dirs):
    with serving(launch("--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none", "--method", "ngram")) as base:
        body = {"prompt": "x = ", "max_tokens": 4, "speculative": {"method": "draft_suffix"}}
        answer = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert answer.status_code == 400 and "--draft-model" in answer.json()["error"]["message"]
        assert httpx.post(f"{base}/v1/completions", json={**body, "speculative": None}, timeout=60).status_code == 200


@pytest.mark.parametrize("tree", ["off", "auto"])
def test_continuous_batching_serves_concurrent_requests_in_shared_forwards_with_outputs_unchanged(tiny_dirs, int4_kernel, tree):
    """An int8 target batches (its C++ layers are row by row): 12 concurrent greedy requests, plain
    and speculative, answer exactly what the library answers for each alone, and /metrics shows
    forwards that served several requests. With token trees on (and speculating at any load), the
    trees of several requests are verified in the same forwards, each with its own tree mask."""
    target = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int8")
    trees = [] if tree == "off" else ["--spec-tree", tree, "--disable-speculation-above", "never"]
    # --prompt-quantize same: the library's default; auto picks a prompt twin from the tiny model's timings (noise)
    with serving(launch("--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]), "--quantize", "int8",
                        "--prompt-quantize", "same", "--served-model-name", "tiny", "--num-speculative-tokens", "3",
                        "--max-concurrency", "8", *trees)) as base:
        prompts = [f"def f{i}(x):" for i in range(12)]

        def request(i: int) -> str:
            body = {"prompt": prompts[i], "max_tokens": 16, "temperature": 0, "ignore_eos": True}
            if i % 2:
                body["speculative"] = None
            response = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["text"]

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(request, range(12)))
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        assert answers == [specdec.generate(target, p, params).text for p in prompts]
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        served_alone = float(next(line.split()[-1] for line in metrics.splitlines()
                                  if line.startswith('specdec_batch_requests_bucket{le="1.0"}')))
        forwards = float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("specdec_batch_requests_count")))
        assert forwards > served_alone, "no forward served more than one request"


def test_the_speculation_limit_switches_drafting_off_and_output_stays_the_same(tiny_dirs, tiny_target):
    """``--disable-speculation-above 0``: every request is over the limit, so none drafts; a limit of
    a thousand never stops one. Both answer what the library answers. /metrics shows the traffic's α
    the γ table plans with: the prior until rounds are drafted, then what they measured."""
    body = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    expected = specdec.generate(tiny_target, body["prompt"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)).text
    drafted, traffic_alpha = {}, {}
    for limit in ("0", "1000"):
        with serving(start_server(tiny_dirs, "--disable-speculation-above", limit)) as base:
            out = httpx.post(f"{base}/v1/completions", json=body, timeout=60).json()
            metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert out["choices"][0]["text"] == expected
        drafted[limit] = out["usage"]["speculative"]["draft_tokens"]
        line = next(x for x in metrics.splitlines() if x.startswith("specdec_traffic_acceptance_rate "))
        traffic_alpha[limit] = float(line.split()[1])
    assert drafted["0"] == 0 and drafted["1000"] > 0
    assert traffic_alpha["0"] == pytest.approx(0.7) and traffic_alpha["1000"] != pytest.approx(0.7)


def test_port_zero_serves_on_the_port_it_prints(tiny_dirs, tmp_path):
    """`--port 0` lets the OS pick a free port; the start-up line must name that port, not 0 — and the draft that
    runs and the settings file read (a tune.json's choice was served without saying which draft ran), and the
    suffix table's cap the process applied."""
    import json
    import re

    config = tmp_path / "tune.json"
    config.write_text(json.dumps({"settings": {"max_concurrency": 2}}))
    proc = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--port", "0", "--model", str(tiny_dirs["target"]),
                             "--draft-model", str(tiny_dirs["draft"]), "--config", str(config),
                             "--dtype", "float32", "--quantize", "none", "--suffix-cache-entries", "5000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        port = None
        for line in proc.stderr:
            found = re.search(r"serving .* on http://127\.0\.0\.1:(\d+)", line)
            if found:
                port = int(found.group(1))
                assert f"draft {tiny_dirs['draft'].name} (float32)" in line and f"settings from {config}" in line, line
                assert "suffix cache ≤ 5000 entries" in line, line  # draft_suffix's table, as capped
                break
        assert port, "no start-up line"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            raise AssertionError(f"nothing answers on port {port}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_n_choices_share_one_prompt_pass_through_the_prefix_cache(tiny_dirs):
    """With the prefix cache on (int8), a prompt's further choices open after its first choice's
    prompt pass and restore its keys/values; each choice is still what a single request with its
    seed answers."""
    # prompts fed 8 tokens a forward: the first choice's prompt pass spans many steps, so a choice
    # opened beside it (not after it) would find nothing cached yet
    with serving(launch("--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]), "--quantize", "int8",
                        "--prompt-quantize", "same", "--served-model-name", "tiny", "--max-concurrency", "4",
                        "--prefill-chunk", "8")) as base:
        def hits() -> float:
            metric = next(line for line in httpx.get(f"{base}/metrics").text.splitlines()
                          if line.startswith("specdec_prefix_cache_hit_tokens_total"))
            return float(metric.split()[1])

        body = {"prompt": "def quicksort(items):\n    " * 6, "max_tokens": 8, "temperature": 1.0, "seed": 5, "ignore_eos": True}
        before = hits()
        together = httpx.post(f"{base}/v1/completions", json={**body, "n": 3}, timeout=120).json()
        prompt_tokens = together["usage"]["prompt_tokens"]
        assert hits() - before >= 2 * (prompt_tokens - 8)  # choices 1 and 2 restored all but the last block
        httpx.post(f"{base}/reset_prefix_cache")
        for index, choice in enumerate(together["choices"]):
            alone = httpx.post(f"{base}/v1/completions", json={**body, "seed": 5 + index}, timeout=120).json()
            assert alone["choices"][0]["text"] == choice["text"]


def test_a_non_streamed_request_stops_when_its_client_leaves(server):
    """A client that gives up on a non-streamed request (a timeout) no longer keeps its generations
    running to the end: the server notices the closed connection, stops them and frees the slots."""
    from urllib.parse import urlparse

    body = json.dumps({"model": "tiny", "prompt": "long", "max_tokens": 480, "temperature": 0, "ignore_eos": True,
                       "n": 4, "speculative": None}).encode()
    url = urlparse(server)

    def generated() -> float:
        line = next(line for line in httpx.get(f"{server}/metrics").text.splitlines()
                    if line.startswith("specdec_generation_tokens_total "))
        return float(line.split()[1])

    before = generated()
    started = time.time()
    with socket.create_connection((url.hostname, url.port)) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        while httpx.get(f"{server}/health").json()["active"] == 0 and time.time() - started < 10:
            time.sleep(0.02)
        # past the prompt pass before leaving (active counts a request from its prompt on: cut inside it, on a busy
        # machine, it had generated nothing and the last assertion failed; 4 × 480 tokens take seconds)
        time.sleep(0.3)
    deadline = time.time() + 10
    while time.time() < deadline and httpx.get(f"{server}/health").json()["active"] != 0:
        time.sleep(0.05)
    assert httpx.get(f"{server}/health").json()["active"] == 0
    assert 'status="499"' in httpx.get(f"{server}/metrics").text  # stopped, not run to the end
    assert generated() > before  # the tokens it generated before it was cut still count


def test_openai_and_vllm_fields_once_ignored_are_honoured_or_refused(server, tiny_target):
    """Fields a client sends that were silently ignored or answered oddly (a walkthrough's list)."""
    completions, chat = f"{server}/v1/completions", f"{server}/v1/chat/completions"
    base = {"model": "tiny", "prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    text = httpx.post(completions, json=base, timeout=60).json()["choices"][0]["text"]
    stop = text[len(text) // 3: len(text) // 3 + 2]
    cut = httpx.post(completions, json={**base, "stop": [stop]}, timeout=60).json()["choices"][0]["text"]
    kept = httpx.post(completions, json={**base, "stop": [stop], "include_stop_str_in_output": True}, timeout=60).json()
    assert kept["choices"][0]["text"] == cut + stop and kept["choices"][0]["finish_reason"] == "stop"
    assert error(httpx.post(completions, json={**base, "best_of": 2}), 400)["param"] == "best_of"
    assert httpx.post(completions, json={**base, "best_of": 1}, timeout=60).status_code == 200
    assert error(httpx.post(completions, json={**base, "stream_options": {"include_usage": True}}), 400)["param"] == "stream_options"
    vocab = tiny_target.config.vocab_size
    assert error(httpx.post(completions, json={**base, "stop_token_ids": [vocab + 5]}), 400)["param"] == "stop_token_ids"
    assert error(httpx.post(completions, json={**base, "prompt": [vocab + 5]}), 400)["param"] == "prompt"
    assert error(httpx.post(completions, json={**base, "prompt": 5}), 400)["param"] == "prompt"  # not "prompt.str"
    user = [{"role": "user", "content": "hi"}]
    required = error(httpx.post(chat, json={"model": "tiny", "messages": user, "tool_choice": "required"}), 400)
    assert "'required'" in required["message"] and "names a tool" not in required["message"]
    assert error(httpx.post(chat, json={"model": "tiny", "messages": user, "tool_choice": 5}), 400)["param"] == "tool_choice"
    answer = httpx.post(chat, json={"model": "tiny", "messages": user, "max_tokens": 2}, timeout=60).json()
    assert answer["id"].startswith("chatcmpl-")
    # OpenAI's deprecated function calling was ignored (logged): the model answered in prose, no function_call came
    legacy = {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    refused = error(httpx.post(chat, json={"model": "tiny", "messages": user, "functions": [legacy], "function_call": "auto"}), 400)
    assert refused["param"] == "functions" and "as tools" in refused["message"]
    none = {"model": "tiny", "messages": user, "max_tokens": 2, "functions": None, "function_call": "none"}
    assert httpx.post(chat, json=none, timeout=60).status_code == 200  # asks for no function calling: ignored
    assert httpx.get(f"{server}/v1/models").json()["data"][0]["created"] > 1_700_000_000
    metrics = httpx.get(f"{server}/metrics").text  # a refusal counts under its endpoint, as successes do (once "any")
    assert 'specdec_requests_total{endpoint="completions",status="400"}' in metrics and 'endpoint="any"' not in metrics


#: `specdec serve` whose model thread calls ``on_chunk(params, chunks_so_far)`` before each streamed chunk (the
#: steps as they are otherwise: they are sent each forward's results); ``step_hook_server`` adds the hook
STEP_HOOK_SERVER = """
import sys
import time
import specdec.server.jobs as jobs
from specdec.cli import main
from specdec.engine import StreamChunk

real = jobs.generate_steps

def hooked_steps(**kwargs):
    steps = real(**kwargs)
    def hooked():
        chunks, sent = 0, None
        while True:
            try:
                item = steps.send(sent)
            except StopIteration:
                return
            if isinstance(item, StreamChunk):
                on_chunk(kwargs["params"], chunks)
                chunks += 1
            sent = yield item
    return hooked()

jobs.generate_steps = hooked_steps
"""


def step_hook_server(on_chunk: str) -> str:
    """The runner script of a server with ``on_chunk`` (Python source defining ``on_chunk(params, chunks)``)."""
    return STEP_HOOK_SERVER + on_chunk + "\nsys.exit(main(sys.argv[1:]))\n"


#: a request with ``max_tokens`` 13 fails after its first ten chunks (an exception the engine did not expect), as a
#: bug or a device error would
FAULTY_SERVER = step_hook_server("""
def on_chunk(params, chunks):
    if params.max_tokens == 13 and chunks == 10:
        raise RuntimeError("injected fault")
""")


def test_a_failure_mid_generation_is_an_error_object_streamed_or_not_and_the_server_stays_up(tiny_dirs, tiny_target):
    """Once a stream's status line is sent, a failure can only be told in the stream: an error event then
    [DONE] (OpenAI and vLLM; the openai SDK raises it), not a cut stream a client reads as finished.
    Not streamed, it is a 500 with OpenAI's error object, not Starlette's plain text."""
    from openai import APIError, InternalServerError, OpenAI

    started = launch("--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none",
                     "--served-model-name", "tiny", runner=("-c", FAULTY_SERVER))
    with serving(started) as base:
        body = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 13, "temperature": 0, "ignore_eos": True,
                "speculative": None}
        with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=60) as response:
            assert response.status_code == 200
            events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert "injected fault" in json.loads(events[-2])["error"]["message"]
        assert json.loads(events[-2])["error"]["type"] == "internal_server_error"
        streamed = "".join(json.loads(event)["choices"][0]["text"] for event in events[:-2])
        whole = specdec.generate(tiny_target, "def f(x):", SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True))
        assert streamed and whole.text.startswith(streamed)  # it had started, and what came is right

        plain = error(httpx.post(f"{base}/v1/completions", json=body, timeout=60), 500)
        assert "injected fault" in plain["message"]

        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        # one token per chunk and no early end, so the fault (at the 10th chunk) is reached: a drafting round's
        # several tokens, or an end of sequence, had made it flaky
        one_by_one = {"speculative": None, "ignore_eos": True}
        with pytest.raises(APIError, match="injected fault"):
            for _ in client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=13, stream=True, extra_body=one_by_one):
                pass
        with pytest.raises(InternalServerError):
            client.completions.create(model="tiny", prompt="x", max_tokens=13, extra_body=one_by_one)
        # the server is up and answers the next request as the library does
        ok = client.completions.create(model="tiny", prompt="def f(x):", max_tokens=12, temperature=0)
        expected = specdec.generate(tiny_target, "def f(x):", SamplingParams(temperature=0.0, max_tokens=12))
        assert ok.choices[0].text == expected.text
        metrics = httpx.get(f"{base}/metrics").text
        assert 'endpoint="completions",status="500"' in metrics and 'endpoint="chat",status="500"' in metrics


def test_a_model_fault_mid_generation_is_ours_not_the_requests():
    """A WeightsError raised mid-generation (NaN logits from corrupt weights) was a 400 blaming the client; so was a
    method plugin's drafter breaking its contract (a DrafterError)."""
    from specdec.errors import DrafterError, SpecdecError, WeightsError
    from specdec.server.errors import generation_failure
    from specdec.server.params import APIError

    assert generation_failure(WeightsError("the target's logits are NaN"), "completions").status == 500
    failed = generation_failure(DrafterError("drafter 'mine': propose() returned a list"), "completions")
    assert failed.status == 500 and "propose() returned a list" in str(failed.body())
    assert generation_failure(SpecdecError("the prompt is too long"), "completions").status == 400
    refusal = APIError(429, "busy")
    assert generation_failure(refusal, "chat") is refusal


def test_model_retrieve_and_the_default_lengths(server, client):
    """OpenAI's ``GET /v1/models/{id}`` (a 404 naming the served model otherwise), and max_tokens left out:
    16 tokens on completions (OpenAI's legacy default and vLLM's; it was 256), up to 256 in chat."""
    from openai import NotFoundError

    assert client.models.retrieve("tiny").id == "tiny"
    card = httpx.get(f"{server}/v1/models/tiny", timeout=10).json()
    assert card["max_model_len"] == 512  # vLLM's field: the tiny model's context
    from specdec import __version__

    assert httpx.get(f"{server}/version", timeout=10).json() == {"version": __version__}  # vLLM's route
    with pytest.raises(NotFoundError, match="this server serves 'tiny'"):
        client.models.retrieve("gpt-4")
    body = {"model": "tiny", "temperature": 0, "ignore_eos": True, "speculative": None}
    completion = httpx.post(f"{server}/v1/completions", json={**body, "prompt": "x"}, timeout=120).json()
    assert completion["usage"]["completion_tokens"] == 16
    chat = httpx.post(f"{server}/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "x"}]},
                      timeout=300).json()
    assert chat["usage"]["completion_tokens"] == 256


def test_serves_default_max_tokens_is_a_flag():
    """A chat request without max_tokens stopped at 256 tokens, said nowhere but in a code comment (a walkthrough with
    the OpenAI SDK: an essay cut at 256); serve's --default-max-tokens N|context sets it ('context': the rest of the
    context window, OpenAI's and vLLM's behaviour)."""
    from specdec.cli import build_parser
    from specdec.server.params import sampling_params
    from specdec.server.schemas import ChatCompletionRequest, CompletionRequest

    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert sampling_params(chat, 4096, 96).max_tokens == 256
    assert sampling_params(chat, 4096, 96, chat_default_max_tokens=None).max_tokens == 4000
    assert sampling_params(chat, 4096, 96, max_tokens_limit=1000, chat_default_max_tokens=None).max_tokens == 1000
    assert sampling_params(CompletionRequest.model_validate({"model": "m", "prompt": "x"}), 4096, 2,
                           chat_default_max_tokens=None).max_tokens == 16
    assert build_parser().parse_args(["serve", "--default-max-tokens", "context"]).default_max_tokens is None
    assert build_parser().parse_args(["serve"]).default_max_tokens == 256
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--default-max-tokens", "lots"])
