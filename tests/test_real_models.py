"""Slow smoke tests on the real default models (pulled from the package registry by `make test`)."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

import specdec
from specdec.bench.datasets import load_prompts
from specdec.errors import IncompatibleModelsError
from specdec.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, is_installed, model_file

pytestmark = pytest.mark.slow


def _need(name: str) -> None:
    if not is_installed(name):
        pytest.skip(f"{name} is not installed (run `specdec models pull {name}`)")


@pytest.fixture(scope="module")
def humaneval_prompt() -> str:
    return load_prompts("humaneval", limit=1)[0].turns[0]


@pytest.fixture(scope="module")
def target_fp32():
    _need(DEFAULT_TARGET)
    model = specdec.load_model(DEFAULT_TARGET, dtype="float32", device="cpu", auto_pull=False)
    yield model
    del model
    gc.collect()


def test_target_greedy_matches_transformers(humaneval_prompt, target_fp32):
    """Our decoder's greedy continuation of a HumanEval prompt == transformers' on the same GGUF."""
    from transformers import AutoModelForCausalLM

    ids = target_fp32.tokenizer.encode(humaneval_prompt)
    ours = specdec.generate(target_fp32, ids, specdec.SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    path = model_file(DEFAULT_TARGET)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    theirs = out[0, len(ids):].tolist()
    del hf
    gc.collect()
    assert ours.token_ids == theirs


def test_default_pair_speculative_greedy_is_identical(humaneval_prompt, target_fp32):
    _need(DEFAULT_DRAFT)
    draft = specdec.load_model(DEFAULT_DRAFT, dtype="float32", device="cpu", auto_pull=False)
    params = specdec.SamplingParams(temperature=0, max_tokens=48)
    plain = specdec.generate(target_fp32, humaneval_prompt, params)
    spec = specdec.generate(target_fp32, humaneval_prompt, params, draft=draft,
                            spec=specdec.SpecConfig(method="draft_model", num_speculative_tokens=4))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.acceptance_rate > 0.5  # same family: most drafts are accepted
    assert spec.stats.target_forwards < plain.stats.target_forwards


def test_qwen_stops_on_endoftext(target_fp32):
    """Both Qwen end tokens stop generation (the GGUF declares only <|im_end|>)."""
    assert {151643, 151645} <= set(target_fp32.tokenizer.stop_token_ids)


def test_mismatched_vocabulary_is_refused(target_fp32):
    _need("smollm2-135m")
    smol = specdec.load_model("smollm2-135m", dtype="float32", device="cpu", auto_pull=False)
    with pytest.raises(IncompatibleModelsError, match="different vocabulary.*token id"):
        specdec.generate(target_fp32, "hi", specdec.SamplingParams(max_tokens=2), draft=smol)


def test_cli_generate_plain_and_speculative(tmp_path):
    """The CLI as a user runs it: stats on stderr, identical text with --compare-plain."""
    import subprocess
    import sys

    _need(DEFAULT_TARGET)
    _need(DEFAULT_DRAFT)
    proc = subprocess.run(
        [sys.executable, "-m", "specdec.cli", "generate", "def add(a, b):", "--max-tokens", "16", "--dtype", "float32",
         "--draft-model", DEFAULT_DRAFT, "--compare-plain", "--json", "--no-pull"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["identical"] is True
    assert report["stats"]["generated_tokens"] == report["plain"]["generated_tokens"]
    assert "tok/s" in proc.stderr and "acceptance_rate" in proc.stderr


@pytest.fixture(scope="module")
def pair_int8():
    _need(DEFAULT_TARGET)
    _need(DEFAULT_DRAFT)
    target = specdec.load_model(DEFAULT_TARGET, dtype="float32", device="cpu", auto_pull=False, quantize="int8")
    draft = specdec.load_model(DEFAULT_DRAFT, dtype="float32", device="cpu", auto_pull=False, quantize="int8")
    yield target, draft
    del target, draft
    gc.collect()


def test_int8_chunk_logits_are_bit_identical_to_single_token_decoding(pair_int8, humaneval_prompt):
    """The int8 mode's promise on the real target: a verification chunk computes exactly the logits
    that decoding the same tokens one at a time computes — so speculative output is plain output."""
    target = pair_int8[0].backend
    ids = pair_int8[0].tokenizer.encode(humaneval_prompt)[:48]
    prefix, chunk = ids[:-6], ids[-6:]
    chunked_state, single_state = target.new_state(64), target.new_state(64)
    target.forward(chunked_state, prefix, num_logits=1)
    target.forward(single_state, prefix, num_logits=1)
    chunked = target.forward(chunked_state, chunk)
    single = torch.cat([target.forward(single_state, [token]) for token in chunk])
    assert torch.equal(chunked, single)


@pytest.mark.parametrize("method", ["draft_model", "draft_suffix", "ngram", "suffix", "layer_skip", "early_exit"])
def test_int8_speculative_greedy_is_identical_for_every_method(pair_int8, humaneval_prompt, method):
    target, draft = pair_int8
    params = specdec.SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    plain = specdec.generate(target, humaneval_prompt, params)
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=4, skip_layers="14-20" if method == "layer_skip" else None)
    out = specdec.generate(target, humaneval_prompt, params, draft=draft, spec=spec)  # draft used where the method needs it
    assert out.token_ids == plain.token_ids
    assert out.stats.proposed_tokens > 0 or method in ("ngram", "suffix")


def test_int8_penalties_greedy_is_identical_and_changes_the_text(pair_int8, humaneval_prompt):
    """Repetition / frequency / presence penalties and a banned token on the real pair: identical to
    plain decoding with them, with drafted tokens verified (the draft applies them to its q too)."""
    target, draft = pair_int8
    unpenalised = specdec.generate(target, humaneval_prompt, specdec.SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
    banned = unpenalised.token_ids[0]  # the answer's first token: the text must change
    params = specdec.SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, repetition_penalty=1.2,
                                    frequency_penalty=0.4, presence_penalty=0.2, logit_bias={banned: -100.0})
    plain = specdec.generate(target, humaneval_prompt, params)
    out = specdec.generate(target, humaneval_prompt, params, draft=draft,
                           spec=specdec.SpecConfig(method="draft_suffix", num_speculative_tokens=4))
    assert out.token_ids == plain.token_ids and banned not in plain.token_ids
    assert out.stats.accepted_tokens > 5, out.stats


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_int8_feature_heads_on_the_real_target(pair_int8, humaneval_prompt, tmp_path, kind):
    """A feature head of the real target's shape (untrained: its weights are not shipped; a trained one
    is `specdec train-drafter`'s output) drafts from the real int8 target's recorded features and the
    output stays plain decoding's; the int8 head reads a small fraction of a target step's bytes."""
    from specdec.models.head_files import save_head
    from specdec.models.heads import HeadConfig, new_head

    target, _ = pair_int8
    torch.manual_seed(0)
    save_head(new_head(HeadConfig.for_target(target.config, kind=kind)), tmp_path)
    params = specdec.SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = specdec.generate(target, humaneval_prompt, params)
    spec = specdec.SpecConfig(method=kind, num_speculative_tokens=3, drafter_path=str(tmp_path))
    out = specdec.generate(target, humaneval_prompt, params, spec=spec)
    assert out.token_ids == plain.token_ids
    assert out.stats.proposed_tokens > 0
    assert out.stats.draft_weight_bytes < 0.25 * target.backend.weight_bytes


@pytest.mark.parametrize("method", ["draft_model", "draft_suffix", "suffix", "ngram"])
def test_int8_tree_speculation_greedy_is_identical(pair_int8, humaneval_prompt, method):
    """Token trees on the real pair (issue 22): every tree node scored in one forward, the caches
    compacted to the accepted path, output token for token plain decoding's."""
    target, draft = pair_int8
    params = specdec.SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    plain = specdec.generate(target, humaneval_prompt, params)
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=4, spec_tree="auto")
    out = specdec.generate(target, humaneval_prompt, params, draft=draft, spec=spec)
    assert out.token_ids == plain.token_ids
    assert out.stats.tree_rounds > 0


@pytest.fixture(scope="module")
def target_int4():
    _need(DEFAULT_TARGET)
    target = specdec.load_model(DEFAULT_TARGET, dtype="float32", device="cpu", auto_pull=False, quantize="int4")
    yield target
    del target
    gc.collect()


def test_int4_runs_the_gguf_q4k_weights_and_is_batch_invariant(target_int4, humaneval_prompt):
    """int4 on the real target: its Q4_K and Q6_K layers compute with exactly the GGUF's weights,
    and a verification chunk's logits equal single-token decoding's bit for bit."""
    import gguf
    import numpy as np

    from specdec.kernels.q4 import Q4Linear
    from specdec.kernels.q6 import Q6Linear
    from specdec.models.gguf_file import open_gguf

    assert target_int4.backend.dtype_name == "int4"
    tensors = {t.name: t for t in open_gguf(target_int4.path).tensors}
    model = target_int4.backend.decoder
    for layer, gguf_name, kind in [(model.model.layers[0].mlp.up_proj, "blk.0.ffn_up.weight", Q4Linear),
                                   (model.lm_head, "output.weight", Q6Linear)]:
        assert isinstance(layer, kind), (gguf_name, type(layer))
        tensor = tensors[gguf_name]
        ref = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        assert torch.equal(layer.dequantized(), torch.from_numpy(ref.reshape(layer.out_features, layer.in_features)))
    backend = target_int4.backend
    ids = target_int4.tokenizer.encode(humaneval_prompt)[:48]
    chunked_state, single_state = backend.new_state(64), backend.new_state(64)
    backend.forward(chunked_state, ids[:-6], num_logits=1)
    backend.forward(single_state, ids[:-6], num_logits=1)
    chunked = backend.forward(chunked_state, ids[-6:])
    assert torch.equal(chunked, torch.cat([backend.forward(single_state, [token]) for token in ids[-6:]]))


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_int4_speculative_greedy_is_identical(target_int4, humaneval_prompt, method):
    params = specdec.SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    plain = specdec.generate(target_int4, humaneval_prompt, params)
    out = specdec.generate(target_int4, humaneval_prompt, params, spec=specdec.SpecConfig(method=method, num_speculative_tokens=4))
    assert out.token_ids == plain.token_ids
