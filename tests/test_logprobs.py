"""``logprobs``: the target's log-probabilities of the emitted tokens, the same with and without
speculation — to the bit in the int4 mode (batch-invariant kernels), to rounding in float32."""

from __future__ import annotations

import math

import pytest
import torch

import specdec
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams

GREEDY = dict(temperature=0, max_tokens=12, ignore_eos=True)


def run(target, draft, prompt: str, method: str | None, **params):  # noqa: ANN001, ANN201
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=3) if method else None
    return specdec.generate(target, prompt, SamplingParams(**{**GREEDY, **params}), draft=draft, spec=spec)


def joined(tokens: list[str]) -> str:
    """Completions logprobs tokens back to text: a token holding part of a character reads
    ``bytes:\\xc3`` (OpenAI's and vLLM's form; the random tiny models emit many)."""
    raw = b"".join(bytes.fromhex(t[len("bytes:"):].replace("\\x", "")) if t.startswith("bytes:") else t.encode()
                   for t in tokens)
    return raw.decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def q4_pair(tmp_path_factory, int4_kernel):
    from tests.conftest import make_tiny_model_dir
    from tests.model_fixtures import TINY_QWEN2_Q4

    root = tmp_path_factory.mktemp("lp")
    load = lambda d: specdec.load_model(d, dtype="float32", device="cpu", quantize="int4")  # noqa: E731
    return (load(make_tiny_model_dir(root / "t", TINY_QWEN2_Q4, seed=3)),
            load(make_tiny_model_dir(root / "d", TINY_QWEN2_Q4, seed=4)))


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_int4_logprobs_are_bit_identical_with_and_without_speculation(q4_pair, method):
    target, draft = q4_pair
    plain = run(target, None, "def fibonacci(n):", None, logprobs=3)
    spec = run(target, draft, "def fibonacci(n):", method, logprobs=3)
    assert spec.token_ids == plain.token_ids and len(plain.logprobs) == len(plain.token_ids) == 12
    assert [(t.token_id, t.logprob, t.top) for t in spec.logprobs] == [(t.token_id, t.logprob, t.top) for t in plain.logprobs]
    if method == "draft_model":
        assert spec.stats.accepted_tokens > 0 or spec.stats.proposed_tokens > 0


def test_logprobs_are_the_target_distribution(tiny_target, tiny_draft):
    """Greedy: the emitted token is the most likely one, its logprob the top alternative's; float
    speculation agrees with plain decoding to rounding."""
    plain = run(tiny_target, None, "for i in", None, logprobs=2)
    spec = run(tiny_target, tiny_draft, "for i in", "draft_model", logprobs=2)
    assert spec.token_ids == plain.token_ids
    for a, b in zip(plain.logprobs, spec.logprobs):
        assert a.token_id == b.token_id and a.logprob <= 0 and math.isclose(a.logprob, b.logprob, abs_tol=1e-4)
        assert a.top[0][0] == a.token_id and a.top[0][1] == a.logprob and len(a.top) == 2
    ids = tiny_target.tokenizer.encode("for i in")
    logits = tiny_target.backend.forward(tiny_target.backend.new_state(64), ids, num_logits=1)
    assert math.isclose(plain.logprobs[0].logprob, float(torch.log_softmax(logits[0], -1).max()), abs_tol=1e-5)


def test_no_logprobs_unless_asked_and_bad_values_refused(tiny_target):
    assert run(tiny_target, None, "x", None).logprobs is None
    assert run(tiny_target, None, "x", None, logprobs=0).logprobs[0].top == []
    for bad in (-1, 21, 1.5):
        with pytest.raises(SpecdecError, match="logprobs"):
            SamplingParams(logprobs=bad)


def test_completion_logprobs_over_http_match_plain_decoding(server):
    import httpx

    body = {"model": "tiny", "prompt": "def fibonacci(n):", "max_tokens": 10, "temperature": 0, "ignore_eos": True,
            "logprobs": 2}
    spec = httpx.post(f"{server}/v1/completions", json=body, timeout=60).json()
    plain = httpx.post(f"{server}/v1/completions", json={**body, "speculative": None}, timeout=60).json()
    assert spec["usage"]["speculative"]["draft_tokens"] > 0 and plain["usage"]["speculative"]["draft_tokens"] == 0
    a, b = spec["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) == 10 and joined(a["tokens"]) == spec["choices"][0]["text"]
    assert all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(a["token_logprobs"], b["token_logprobs"]))
    assert a["text_offset"][0] == 0 and a["text_offset"] == sorted(a["text_offset"])
    # the chosen token is always among its alternatives (OpenAI's legacy completions: up to logprobs + 1 of them)
    assert all(len(top) <= 3 and top[token] == lp for top, token, lp in zip(a["top_logprobs"], a["tokens"], a["token_logprobs"]))


def test_chat_logprobs_streamed_and_through_the_openai_client(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0,
                  logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kwargs)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens and all(len(c.top_logprobs) == 2 for c in content)
    streamed = [c for chunk in client.chat.completions.create(**kwargs, stream=True)
                if chunk.choices and chunk.choices[0].logprobs for c in chunk.choices[0].logprobs.content]
    assert [c.token for c in streamed] == [c.token for c in content]
    assert all(math.isclose(x.logprob, y.logprob, abs_tol=1e-4) for x, y in zip(streamed, content))


def test_bad_logprob_requests_get_400(server):
    import httpx

    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for body, path in (({**chat, "top_logprobs": 2}, "/v1/chat/completions"),
                       ({**chat, "logprobs": True, "top_logprobs": 50}, "/v1/chat/completions"),
                       ({"model": "tiny", "prompt": "x", "max_tokens": 4, "logprobs": -1}, "/v1/completions")):
        response = httpx.post(f"{server}{path}", json=body, timeout=30)
        assert response.status_code == 400 and "logprobs" in response.json()["error"]["message"]


def test_prompt_logprobs_are_each_prompt_tokens_under_a_whole_prompt_forward(tiny_target):
    """vLLM's prompt_logprobs: row i of one forward over the prompt scores token i + 1 (the first
    has none); long prompts are scored in chunks, bypassing the prefix cache, the same numbers."""
    prompt = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 6
    out = run(tiny_target, None, prompt, None, prompt_logprobs=3, max_tokens=2)
    ids = out.prompt_ids
    assert len(ids) > 128 and len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None  # several chunks
    rows = torch.log_softmax(tiny_target.backend.forward(tiny_target.backend.new_state(len(ids) + 1), ids).float(), -1)
    for i, score in enumerate(out.prompt_logprobs[1:]):
        assert score.token_id == ids[i + 1] and math.isclose(score.logprob, float(rows[i, ids[i + 1]]), abs_tol=1e-4)
        assert [t for t, _ in score.top] == torch.topk(rows[i], 3).indices.tolist()
    assert out.token_ids == run(tiny_target, None, prompt, None, max_tokens=2).token_ids
    with pytest.raises(SpecdecError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)


def test_echo_puts_the_prompt_and_its_logprobs_first(server):
    """OpenAI's echo (what evaluation harnesses send to score a text): the prompt's text, then the
    output; with logprobs the prompt tokens' too, the first null — streamed or not."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    kwargs = dict(model="tiny", prompt="def fibonacci(n):", max_tokens=4, temperature=0, echo=True, logprobs=1,
                  extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs)
    plain = client.completions.create(**{**kwargs, "echo": False})
    choice = whole.choices[0]
    assert choice.text == "def fibonacci(n):" + plain.choices[0].text
    lp = choice.logprobs
    assert joined(lp.tokens) == choice.text and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None for x in lp.token_logprobs[1:])
    assert all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(lp.token_logprobs[-4:], plain.choices[0].logprobs.token_logprobs))
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-4] == len("def fibonacci(n):")
    streamed_text, streamed_tokens = "", []
    for chunk in client.completions.create(**kwargs, stream=True):
        streamed_text += chunk.choices[0].text if chunk.choices else ""
        if chunk.choices and chunk.choices[0].logprobs:
            streamed_tokens += chunk.choices[0].logprobs.tokens
    assert streamed_text == choice.text and streamed_tokens == lp.tokens


def test_vllm_prompt_logprobs_field_on_completions_and_chat(server, tiny_target):
    """vLLM's ``prompt_logprobs: N`` (it was ignored: unknown fields are): per prompt token null (the first)
    or {token id: {logprob, rank, decoded_token}} for the prompt's token and the N likeliest — per choice
    in completions, once at the top in chat; the same numbers as the library's; 400 when streamed or out of
    range. Echo's logprobs keep their own number of alternatives beside it."""
    import httpx

    prompt = "def fibonacci(n):"
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "prompt_logprobs": 2}
    answer = httpx.post(f"{server}/v1/completions", json=body, timeout=60).json()
    rows = answer["choices"][0]["prompt_logprobs"]
    library = run(tiny_target, None, prompt, None, prompt_logprobs=2, max_tokens=3)
    assert len(rows) == len(library.prompt_ids) and rows[0] is None
    for row, score, token in zip(rows[1:], library.prompt_logprobs[1:], library.prompt_ids[1:]):
        assert math.isclose(row[str(token)]["logprob"], score.logprob, abs_tol=1e-4)
        assert row[str(token)]["rank"] == score.rank >= 1
        assert {key for key, entry in row.items() if entry["rank"] <= 2} >= {str(t) for t, _ in score.top}
        assert 2 <= len(row) <= 3
    assert answer["choices"][0]["logprobs"] is None and answer["choices"][0]["text"] == library.text

    echoed = httpx.post(f"{server}/v1/completions", json={**body, "echo": True, "logprobs": 1, "prompt_logprobs": 3},
                        timeout=60).json()["choices"][0]
    echoed_logprobs = echoed["logprobs"]
    assert all(1 <= len(top) <= 2 and top[token] == lp  # echo's own count, and the prompt's token itself
               for top, token, lp in zip(echoed_logprobs["top_logprobs"][1:], echoed_logprobs["tokens"][1:],
                                         echoed_logprobs["token_logprobs"][1:]))
    assert all(len(row) >= 3 for row in echoed["prompt_logprobs"][1:])

    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "prompt_logprobs": 0}
    answer = httpx.post(f"{server}/v1/chat/completions", json=chat, timeout=60).json()
    assert answer["prompt_logprobs"][0] is None and all(len(row) == 1 for row in answer["prompt_logprobs"][1:])
    assert "prompt_logprobs" not in answer["choices"][0]

    for bad, fragment in (({**body, "stream": True}, "not available when stream"), ({**body, "prompt_logprobs": 21}, "[0, 20]")):
        response = httpx.post(f"{server}/v1/completions", json=bad, timeout=30)
        assert response.status_code == 400 and fragment in response.json()["error"]["message"]
        assert response.json()["error"]["param"] == "prompt_logprobs"


def test_logprobs_bytes_rebuild_text_whose_characters_split_across_tokens(tiny_target):
    """A character whose UTF-8 bytes span several tokens: each token alone decodes to U+FFFD, so its
    ``bytes`` were U+FFFD's, completions' offsets ran backwards and top_logprobs keys collided. Now
    the bytes are the token's own (joined, the text), a partial token reads ``bytes:\\x..``, and
    offsets only grow — also across a stream's chunks."""
    from specdec.sampling import TokenLogprob
    from specdec.server.responses import TextOffsets, logprobs_body

    tokenizer = tiny_target.tokenizer
    text = "Fraktur: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 é"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # the case: split characters
    scores = [TokenLogprob(i, -1.0, [(i, -1.0), (ids[0] if i != ids[0] else ids[1], -2.0)]) for i in ids]
    chat = logprobs_body(scores, tokenizer, chat=True)["content"]
    assert bytes(b for entry in chat for b in entry["bytes"]).decode() == text
    assert any(entry["token"].startswith("bytes:\\x") for entry in chat)
    whole = logprobs_body(scores, tokenizer, chat=False)
    offsets = whole["text_offset"]
    assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] < len(text)
    assert all(len(top) == 2 for top in whole["top_logprobs"])  # distinct keys
    stream = TextOffsets()
    halves = [logprobs_body(part, tokenizer, chat=False, offsets=stream) for part in (scores[:5], scores[5:])]
    assert halves[0]["text_offset"] + halves[1]["text_offset"] == offsets and stream.position == len(text)


def test_completions_alternatives_always_hold_the_chosen_token(tiny_target):
    """OpenAI's legacy completions return the sampled token's log-probability among its ``top_logprobs`` ("up to
    logprobs+1 elements"; vLLM too): a token sampled outside the likeliest ``logprobs`` was missing there, and a
    client looking it up got a KeyError. Chat keeps OpenAI's chat shape (its alternatives only)."""
    from specdec.sampling import TokenLogprob
    from specdec.server.responses import logprobs_body

    tokenizer = tiny_target.tokenizer
    chosen, likelier = tokenizer.encode("x = 3", add_special_tokens=False)[-2:]
    scores = [TokenLogprob(chosen, -2.5, [(likelier, -0.4)]), TokenLogprob(likelier, -0.4, [(likelier, -0.4)])]
    body = logprobs_body(scores, tokenizer, chat=False)
    chosen_text, likelier_text = body["tokens"]
    assert body["top_logprobs"][0] == {likelier_text: -0.4, chosen_text: -2.5}
    assert body["top_logprobs"][1] == {likelier_text: -0.4}  # already there: listed once
    chat = logprobs_body(scores, tokenizer, chat=True)["content"]
    assert [entry["token"] for entry in chat[0]["top_logprobs"]] == [likelier_text]
