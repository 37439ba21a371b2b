"""Prompt passes in another CPU execution mode (``--prompt-quantize``): an int4 model's prefill and a
draft model's catch-up run through its int8 twin, which writes the same caches. Exact: a row's mode
depends only on whether it is a prompt row, so speculative output equals plain output, alone and
batched."""

from __future__ import annotations

import pytest

import specdec
from specdec.cost_model import Curve
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams

PROMPTS = ["def add(a, b):\n    return", "The quick brown fox jumps over the lazy dog and then", "for i in range(10):"]


@pytest.fixture(scope="module")
def hybrid_pair(tiny_dirs, int4_kernel):
    target = specdec.load_model(tiny_dirs["target"], quantize="int4", prompt_quantize="int8")
    draft = specdec.load_model(tiny_dirs["draft"], quantize="int4-all", prompt_quantize="int8")
    return target, draft


def test_prompt_passes_run_on_the_prompt_backend(hybrid_pair):
    target, draft = hybrid_pair
    assert target.backend.prompt_backend is not target.backend
    assert (target.backend.prompt_backend.dtype_name, target.backend.dtype_name) == ("int8", "int4")
    # one embedding table and one LM head for both: only the layers are a second copy
    assert target.backend.prompt_backend.decoder.model.embed_tokens is target.backend.decoder.model.embed_tokens
    assert target.backend.prompt_backend.decoder.lm_head is target.backend.decoder.lm_head
    seen = []
    prompt_forward = target.backend.prompt_backend.forward
    decode_forward = target.backend.forward
    target.backend.prompt_backend.forward = lambda state, tokens, **kw: (seen.append(("prompt", len(tokens))), prompt_forward(state, tokens, **kw))[1]
    target.backend.forward = lambda state, tokens, **kw: (seen.append(("decode", len(tokens))), decode_forward(state, tokens, **kw))[1]
    try:
        out = specdec.generate(target, PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    finally:
        del target.backend.prompt_backend.forward, target.backend.forward
    prompt_len = len(target.tokenizer.encode(PROMPTS[0]))
    assert seen[0] == ("prompt", prompt_len) and all(kind == "decode" for kind, _ in seen[1:])
    assert len(out.token_ids) == 6


@pytest.mark.parametrize("spec", [specdec.SpecConfig(method="draft_model", num_speculative_tokens=3),
                                  specdec.SpecConfig(method="draft_model", num_speculative_tokens=2, spec_tree=4),
                                  specdec.SpecConfig(method="suffix", num_speculative_tokens=4)],
                         ids=["draft", "draft-tree", "suffix"])
def test_speculative_output_is_plain_output_with_prompt_passes_in_int8(hybrid_pair, spec):
    target, draft = hybrid_pair
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    for prompt in PROMPTS:
        plain = specdec.generate(target, prompt, params)
        fast = specdec.generate(target, prompt, params, draft=draft if spec.method == "draft_model" else None, spec=spec)
        assert fast.token_ids == plain.token_ids


def test_batched_requests_equal_each_alone_with_prompt_passes_in_int8(hybrid_pair):
    """The scheduler sends prompt chunks (the int8 twin) and decode steps (int4) to separate forwards;
    each request's output is its output alone."""
    target, draft = hybrid_pair
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3)
    outs = specdec.generate_batch(target, PROMPTS, params, draft=draft, spec=spec, max_num_seqs=3, prefill_chunk=4)
    assert [o.token_ids for o in outs] == [specdec.generate(target, p, params).token_ids for p in PROMPTS]


def test_a_draft_catches_up_on_its_prompt_backend(hybrid_pair):
    """A draft forward of PROMPT_PASS_ROWS or more tokens (its pass over the prompt) runs on the
    draft's int8 twin; its estimate of that pass reads the twin's curve."""
    from specdec.drafters.draft_model import PROMPT_PASS_ROWS, DraftModelDrafter

    _, draft = hybrid_pair
    assert PROMPT_PASS_ROWS > 1
    drafter = DraftModelDrafter(draft.backend, SamplingParams(temperature=0), None, 64)
    assert drafter._runner(PROMPT_PASS_ROWS) is draft.backend.prompt_backend
    assert drafter._runner(PROMPT_PASS_ROWS - 1) is draft.backend


def test_auto_takes_the_mode_whose_rows_cost_clearly_less(tmp_path, monkeypatch):
    from specdec.models.config import ModelConfig
    from specdec.step_costs import choose_prompt_mode

    cfg = ModelConfig(arch="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                      num_kv_heads=2, head_dim=16, max_position_embeddings=256)
    vnni = {"int8": Curve("int8", {1: 0.0597, 16: 0.1251, 32: 0.2019}),  # Zen 4 EPYC, 1.5B (curve v6)
            "int4": Curve("int4", {1: 0.0317, 16: 0.1512, 32: 0.2881})}
    monkeypatch.setattr("specdec.step_costs.cpu_candidates", lambda cfg, modes: modes)
    monkeypatch.setattr("specdec.step_costs.curves_for", lambda cfg, modes: {m: vnni[m] for m in modes})
    assert choose_prompt_mode(cfg, "int4") == "int8"
    assert choose_prompt_mode(cfg, "int8") == "int8"
    close = {"int8": Curve("int8", {16: 0.100, 32: 0.180}), "int4": Curve("int4", {16: 0.100, 32: 0.190})}
    monkeypatch.setattr("specdec.step_costs.curves_for", lambda cfg, modes: {m: close[m] for m in modes})
    assert choose_prompt_mode(cfg, "int4") == "int4"  # 5 % cheaper rows do not pay for a second copy


def test_bad_prompt_modes_are_clear_errors(tiny_dirs, int4_kernel):
    with pytest.raises(SpecdecError, match="unknown prompt execution"):
        specdec.load_model(tiny_dirs["target"], quantize="int4", prompt_quantize="fp8")
    with pytest.raises(SpecdecError, match="needs a CPU execution mode"):
        specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", prompt_quantize="int8")
    same = specdec.load_model(tiny_dirs["target"], quantize="int4", prompt_quantize="same")
    assert same.backend.prompt_backend is same.backend
