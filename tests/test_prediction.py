"""Predicted outputs (OpenAI's ``prediction``): drafted from by the suffix drafters, never changing
the output — greedy identity whatever the prediction, the χ² certificate under sampling, OpenAI's
usage figures and request shapes over HTTP, clear errors for bad predictions."""

from __future__ import annotations

import httpx
import pytest

import specdec
from specdec.certify import DISTRIBUTION_CONFIGS, distribution_check, tiny_model
from specdec.drafters.base import DrafterResources
from specdec.drafters.registry import all_methods, method_info
from specdec.drafters.suffix import GlobalSuffixCache, SuffixDrafter, clear_global_caches
from specdec.engine import generate_ids
from specdec.errors import SpecdecError
from specdec.prediction import count_prediction
from specdec.sampling import SamplingParams, make_generator
from tests.test_server import serving, start_server

PROMPT = "def fibonacci(n):"


def run(target, draft, method: str | None, prediction, max_tokens: int = 40, gamma: int | str = 3):
    clear_global_caches()  # each run drafts from its own prompt and prediction only
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, prediction=prediction)
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=gamma) if method else None
    return specdec.generate(target, PROMPT, params, draft=draft if method in ("draft_suffix", "draft_model") else None,
                            spec=spec)


@pytest.mark.parametrize("method", ["suffix", "draft_suffix", "ngram", "draft_model"])
def test_greedy_output_is_plain_decodings_whatever_the_prediction(tiny_target, tiny_draft, method):
    plain = run(tiny_target, None, None, None)
    unhelped = run(tiny_target, tiny_draft, method, None)
    edited = plain.token_ids[:15] + [7, 8, 9] + plain.token_ids[18:]  # an edit in the middle
    cases = {"exact": plain.token_ids, "edited": edited, "unrelated": [5, 6] * 20, "text": plain.text}
    results = {name: run(tiny_target, tiny_draft, method, prediction) for name, prediction in cases.items()}
    for name, result in results.items():
        assert result.token_ids == plain.token_ids, name
        assert result.stats.prediction_counts is not None, name
    accepted, rejected = results["exact"].stats.prediction_counts
    assert accepted >= 20 and rejected <= 1
    assert results["exact"].stats.target_forwards < unhelped.stats.target_forwards / 2  # the prediction was followed
    assert results["edited"].stats.prediction_counts[1] >= 1  # the edit was drafted from and refused
    assert results["unrelated"].stats.prediction_counts[0] == 0
    assert "prediction:" in results["exact"].stats.summary_line()
    assert results["exact"].stats.to_dict()["prediction_accepted_tokens"] == accepted
    assert results["exact"].stats.method == unhelped.stats.method == method
    if method == "draft_model":  # the draft model does not run where the prediction is sure
        assert results["exact"].stats.draft_forwards < unhelped.stats.draft_forwards / 2


def test_a_method_that_does_not_read_predictions_ignores_them(tiny_target):
    plain = run(tiny_target, None, None, None)
    result = specdec.generate(tiny_target, PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                                   prediction=plain.token_ids),
                              spec=specdec.SpecConfig(method="layer_skip", num_speculative_tokens=3, skip_layers=[1]))
    assert result.token_ids == plain.token_ids and result.stats.prediction_counts is None
    assert not method_info("layer_skip").reads_prediction and method_info("draft_model").reads_prediction
    assert [info.name for info in all_methods() if info.reads_prediction] == ["draft_model", "draft_suffix", "ngram", "suffix"]


def test_sampled_output_keeps_the_targets_distribution_with_a_prediction():
    """The certificate's prediction configuration, for the two methods that read it — after checking
    that the suffix drafter really drafts from the prediction there (else the test proves nothing)."""
    params = DISTRIBUTION_CONFIGS["T=1,prediction"]
    target = tiny_model(seed=0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    run_params = SamplingParams(**{**params.__dict__, "max_tokens": 3, "ignore_eos": True})
    used = 0
    for seed in range(40):
        drafter = SuffixDrafter(GlobalSuffixCache(), prediction=tuple(params.prediction), max_tokens=2)
        generate_ids(target, prompt, run_params, drafter, specdec.SpecConfig(method="suffix", num_speculative_tokens=2),
                     None, make_generator(seed))
        used += sum(drafter.prediction_counts)
    assert used > 10
    for method in ("suffix", "draft_suffix", "ngram"):
        result = distribution_check(method, "T=1,prediction", params, samples=2500)
        assert result.passed, result.detail


def test_suffix_with_gamma_auto_drafts_as_far_as_it_is_sure(tiny_target):
    """Regression: the suffix method under γ=auto drafted one token a round (its γ controller never
    measures a draft step, so it kept choosing 1); a table's tokens are free, so it proposes up to
    the γ maximum and the engine's cost model cuts the length."""
    plain = run(tiny_target, None, None, None, max_tokens=60)
    result = run(tiny_target, None, "suffix", plain.token_ids, max_tokens=60, gamma="auto")
    assert result.token_ids == plain.token_ids
    assert max(result.stats.gamma_history) > 1 and result.stats.target_forwards < 20


def test_count_prediction_counts_the_checked_tokens_only():
    # tokens 0-1 kept, token 2 checked and refused, token 3 never compared
    assert count_prediction([4, 5, 6, 7], [True, False, True, True], 2, next_token=9) == (1, 1)
    assert count_prediction([4, 5, 6], [True, True, True], 2, next_token=6) == (3, 0)  # cut there, the same token
    assert count_prediction([4, 5], [True, True], 2, next_token=1) == (2, 0)


@pytest.mark.parametrize("prediction,fragment", [
    ([-1, 2], "prediction must be text or a list of token ids"),
    ({"a": 1}, "prediction must be text or a list of token ids"),
])
def test_bad_predictions_are_refused_up_front(prediction, fragment):
    with pytest.raises(SpecdecError, match=fragment):
        SamplingParams(prediction=prediction)


def test_predictions_outside_the_vocabulary_or_context_are_refused(tiny_target):
    for prediction, fragment in (([1, 10**6], "outside the vocabulary"), ([1] * 10_000, "longer than the model's context")):
        with pytest.raises(SpecdecError, match=fragment):
            specdec.generate(tiny_target, PROMPT, SamplingParams(max_tokens=4, prediction=prediction),
                             spec=specdec.SpecConfig(method="suffix"))


@pytest.fixture(scope="module")
def server(tiny_dirs):
    with serving(start_server(tiny_dirs, "--max-concurrency", "4")) as base:
        yield base


def test_server_prediction_is_drafted_from_and_reported_as_openai_does(server, tiny_target):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    plain = httpx.post(f"{server}/v1/completions", json={**body, "speculative": None}, timeout=60).json()
    text = plain["choices"][0]["text"]
    assert "completion_tokens_details" not in plain["usage"]
    httpx.post(f"{server}/reset_suffix_cache")
    helped = httpx.post(f"{server}/v1/completions", json={**body, "prediction": {"type": "content", "content": text}},
                        timeout=60).json()
    assert helped["choices"][0]["text"] == text
    details = helped["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0 and details["rejected_prediction_tokens"] >= 0
    # OpenAI's list-of-parts form, and a plain request with a prediction (nothing drafts: zeros)
    parts = {"type": "content", "content": [{"type": "text", "text": text[:10]}, {"type": "text", "text": text[10:]}]}
    httpx.post(f"{server}/reset_suffix_cache")
    as_parts = httpx.post(f"{server}/v1/completions", json={**body, "prediction": parts}, timeout=60).json()
    assert as_parts["choices"][0]["text"] == text
    assert as_parts["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0  # (lengths follow timings)
    unread = httpx.post(f"{server}/v1/completions", json={**body, "prediction": parts, "speculative": None}, timeout=60).json()
    assert unread["usage"]["completion_tokens_details"] == {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    streamed = httpx.post(f"{server}/v1/completions", timeout=60, json={
        **body, "prediction": parts, "n": 2, "stream": True, "stream_options": {"include_usage": True}}).text
    events = [line for line in streamed.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and '"accepted_prediction_tokens"' in events[-2]  # the usage chunk


def test_chat_content_parts_equal_the_string_form(server):
    def chat(content) -> httpx.Response:
        return httpx.post(f"{server}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content, "name": "ann"}]})

    as_string = chat("hello there").json()
    as_parts = chat([{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]).json()
    assert as_parts["choices"][0]["message"]["content"] == as_string["choices"][0]["message"]["content"]
    image = chat([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}])
    assert image.status_code == 400 and "messages.1.content" in image.json()["error"]["message"]


@pytest.mark.parametrize("prediction,fragment", [
    ({"type": "file", "content": "x"}, "prediction.type"),
    ({"type": "content"}, "prediction.content"),
    ({"type": "content", "content": "x" * 20_000}, "longer than the model's context"),
])
def test_server_bad_prediction_is_a_400_and_the_server_stays_up(server, prediction, fragment):
    response = httpx.post(f"{server}/v1/completions", timeout=60,
                          json={"model": "tiny", "prompt": "x", "max_tokens": 4, "prediction": prediction})
    assert response.status_code == 400 and fragment in response.json()["error"]["message"]
    assert httpx.get(f"{server}/health").status_code == 200


def test_cli_generate_reads_a_prediction_file_and_warns_where_unused(tiny_dirs, tmp_path, capsys):
    from specdec.cli import main

    model = ["--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none", "--max-tokens", "24",
             "--ignore-eos"]
    assert main(["generate", PROMPT, *model]) == 0
    plain = capsys.readouterr().out
    predicted = tmp_path / "expected.txt"
    predicted.write_text(plain.rstrip("\n"))
    assert main(["generate", PROMPT, *model, "--method", "suffix", "--prediction", str(predicted), "--json"]) == 0
    out, err = capsys.readouterr()
    assert out == plain and "prediction:" in err and '"prediction_accepted_tokens"' in err
    assert main(["generate", PROMPT, *model, "--prediction", "anything"]) == 0
    assert "--prediction is not used by plain decoding (methods that draft from it: draft_model, draft_suffix, ngram, suffix)" in capsys.readouterr().err


def test_ngram_trees_go_as_deep_as_the_gamma_maximum_whatever_k():
    """Regression: n-gram trees carry estimates, so a γ=auto controller never measures a draft step
    for them and keeps asking k=1 — they were one token deep (τ 1.39 vs 1.69 on HumanEval, int8)."""
    from specdec.drafters.prompt_lookup import PromptLookupDrafter
    from specdec.tree import depths

    drafter = PromptLookupDrafter(tree_nodes=8, max_tokens=8)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    drafter.start(prompt)
    draft = drafter.propose(prompt, 1)
    assert draft.is_tree and max(depths(draft.parents)) >= 5 and draft.tokens[:3] == [3, 4, 5]
    # and a prediction's run, likewise
    predicted = PromptLookupDrafter(prediction=(3, 4, 5, 6, 7, 8, 9, 10, 11), max_tokens=8)
    predicted.start(prompt)
    assert predicted.propose(prompt, 1).tokens == [3, 4, 5, 6, 7, 8, 9, 10]


def test_the_prediction_learns_its_own_acceptance_rate():
    """A prediction's tokens are right for long runs or hardly at all: their trials move a rate of
    their own, not the one the request's repeats are estimated with."""
    drafter = SuffixDrafter(GlobalSuffixCache(), prediction=(7, 8, 9, 10), max_tokens=4)
    prompt = [1, 2, 3]
    drafter.start(prompt)
    draft = drafter.propose(prompt, 4)
    assert draft.tokens == [7, 8, 9, 10] and drafter.proposed_predicted == [True] * 4
    shared = (list(drafter.match_accepts), list(drafter.match_trials))
    drafter.accepted(0, 5)  # the first predicted token was refused
    assert (drafter.match_accepts, drafter.match_trials) == shared
    assert drafter.prediction_trials != shared[1] and drafter.prediction_counts == (0, 1)


def test_the_openai_client_sends_a_prediction_and_reads_its_usage(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "repeat after me"}]
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=30, temperature=0,
                                           extra_body={"ignore_eos": True, "speculative": None})
    text = plain.choices[0].message.content
    httpx.post(f"{server}/reset_suffix_cache")
    helped = client.chat.completions.create(model="tiny", messages=messages, max_tokens=30, temperature=0,
                                            prediction={"type": "content", "content": text}, extra_body={"ignore_eos": True})
    assert helped.choices[0].message.content == text
    assert helped.usage.completion_tokens_details.accepted_prediction_tokens > 0
