"""Self-speculation (layer skip, early exit): exact, weight-free, cache-neutral, calibratable."""

from __future__ import annotations

import json
import logging

import pytest

import specdec
from specdec.config import SpecConfig
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams

PROMPTS = ["def fibonacci(n):", "The quick brown fox jumps over the lazy dog. The quick", "x = 1\ny = 2\n"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.mark.parametrize("spec", [
    SpecConfig(method="layer-skip", num_speculative_tokens=3, skip_layers="2"),
    SpecConfig(method="layer_skip", num_speculative_tokens="auto", skip_layers=[1, 2]),
    SpecConfig(method="layer_skip", num_speculative_tokens=5),  # default skip set
    SpecConfig(method="early-exit", num_speculative_tokens=4, exit_layer=1),
    SpecConfig(method="early_exit", num_speculative_tokens=2, exit_layer=3),
], ids=["skip-2", "skip-1,2-auto", "skip-default", "exit-1", "exit-3"])
def test_greedy_identity_with_plain_decoding(tiny_target, spec):
    for prompt in PROMPTS:
        plain = specdec.generate(tiny_target, prompt, GREEDY)
        out = specdec.generate(tiny_target, prompt, GREEDY, spec=spec)
        assert out.token_ids == plain.token_ids, (spec, prompt)
        assert out.stats.proposed_tokens > 0


@pytest.mark.parametrize("spec", [
    SpecConfig(method="layer_skip", num_speculative_tokens=4, skip_layers=[]),
    SpecConfig(method="early_exit", num_speculative_tokens=4, exit_layer=4),
], ids=["skip-none", "exit-at-last-layer"])
def test_running_every_layer_accepts_every_draft(tiny_target, spec):
    """The draft path with all layers IS the full model: α = 1 proves it computes what the target does."""
    for prompt in PROMPTS:
        out = specdec.generate(tiny_target, prompt, GREEDY, spec=spec)
        assert out.stats.proposed_tokens > 0
        assert out.stats.acceptance_rate == 1.0


def test_sampling_matches_plain_decoding_statistically_is_covered_by_certify():
    from specdec.certify import registered_methods

    assert {"layer_skip", "early_exit"} <= set(registered_methods())  # test_certify runs χ² on each


def test_drafter_holds_no_weights_and_no_cache(tiny_target):
    from specdec.api import make_drafter
    from specdec.sampling import make_generator

    spec = SpecConfig(method="layer_skip", skip_layers="1-2")
    drafter = make_drafter(tiny_target, spec, GREEDY, make_generator(0), 64)
    assert drafter.weights_shared_with(tiny_target.backend)
    assert drafter.backend.backend.decoder is tiny_target.backend.decoder  # the same module, not a copy
    assert drafter.state is None  # no KV cache of its own: it is handed the target's
    assert drafter.backend.weight_bytes < tiny_target.backend.weight_bytes


def test_drafting_leaves_the_target_cache_as_it_found_it(tiny_target):
    from specdec.drafters.layer_skip import LayerSkipDrafter, LayerSubset
    from specdec.sampling import make_generator

    backend = tiny_target.backend
    ids = tiny_target.tokenizer.encode(PROMPTS[0])
    state = backend.new_state(64)
    backend.forward(state, ids[:-1])
    before_k = state.k[:, :, : state.seq_len].clone()
    drafter = LayerSkipDrafter(LayerSubset(backend, [0, 3]), GREEDY, make_generator(0))
    drafter.bind_target_state(state)
    draft = drafter.propose(ids, 5)
    assert len(draft) == 5
    assert state.seq_len == len(ids) - 1
    assert (state.k[:, :, : state.seq_len] == before_k).all()


def test_bad_layer_settings_are_clear_errors(tiny_target):
    def make(**kwargs):  # noqa: ANN003
        return specdec.generate(tiny_target, "x", GREEDY, spec=SpecConfig(**kwargs))

    with pytest.raises(SpecdecError, match="outside 0..3"):
        make(method="layer_skip", skip_layers="7")
    with pytest.raises(SpecdecError, match=r"\) 100, 101, 102, 103, 104 … \(101 layers\) outside 0..3: this model has 4 layers$"):
        make(method="layer_skip", skip_layers="100-200")  # it printed all 101
    with pytest.raises(SpecdecError, match="at least one layer"):
        make(method="layer_skip", skip_layers="0-3")
    with pytest.raises(SpecdecError, match="cannot read layer list"):
        make(method="layer_skip", skip_layers="two")
    with pytest.raises(SpecdecError, match=r"exit-layer \(exit_layer=\) must be in 1..4"):
        make(method="early_exit", exit_layer=9)
    with pytest.raises(SpecdecError, match="exit_layer must be a positive integer"):
        SpecConfig(method="early_exit", exit_layer=0)


def test_a_draft_of_every_layer_is_said_to_cost_more_than_it_saves(tiny_target, caplog, monkeypatch):
    """--exit-layer at the model's depth drafts with the whole target (slower than plain decoding): allowed, said
    once (drafters are built per request: a server said it per request)."""
    monkeypatch.setattr("specdec.drafters.layer_skip._WARNED_WHOLE_MODEL", set())
    with caplog.at_level("WARNING", logger="specdec.drafters.layer_skip"):
        specdec.generate(tiny_target, "x", GREEDY, spec=SpecConfig(method="early_exit", exit_layer=3))
        assert "every layer" not in caplog.text
        for _ in range(2):
            specdec.generate(tiny_target, "x", GREEDY, spec=SpecConfig(method="early_exit", exit_layer=4))
    assert caplog.text.count("--exit-layer (exit_layer=) 4 is every layer: the draft runs all 4 layers") == 1


def test_calibrate_then_skip_layers_auto(tiny_dirs, tiny_target, tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    from specdec.cli import main

    with pytest.raises(SpecdecError, match="no calibration"):
        specdec.generate(tiny_target, "x", GREEDY, spec=SpecConfig(method="layer_skip", skip_layers="auto"))

    data = tmp_path / "cal.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS) + "\n")
    args = ["calibrate-skip", "--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none", "--dataset", str(data),
            "--limit", "2", "--max-tokens", "12", "--budget", "3"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "best skip" in out.out and "[3/3]" in out.err
    saved = list((tmp_path / "home" / "calibration").glob("*.layer-skip.json"))
    assert len(saved) == 1
    result = json.loads(saved[0].read_text())
    assert len(result["trials"]) == 3 and result["plain_tokens_per_s"] > 0
    assert result["tokens_per_s"] == pytest.approx(max(t["tokens_per_s"] for t in result["trials"]), abs=1e-3)
    assert ("no skip set beat plain decoding" in out.err) == (result["speedup"] < 1)

    # a faster earlier calibration (a longer search) is not replaced by a quick re-run, unless asked
    better = {**result, "skip_layers": [1], "speedup": 99.0, "created": "earlier"}
    saved[0].write_text(json.dumps(better))
    assert main([*args, "--budget", "1"]) == 0
    assert "kept the saved calibration" in capsys.readouterr().out
    assert json.loads(saved[0].read_text()) == better
    assert main([*args, "--budget", "1", "--overwrite"]) == 0
    assert "saved" in capsys.readouterr().out
    assert json.loads(saved[0].read_text())["speedup"] < 99
    saved[0].write_text(json.dumps(result))

    spec = SpecConfig(method="layer_skip", skip_layers="auto", num_speculative_tokens=3)
    from specdec.api import make_drafter
    from specdec.sampling import make_generator

    drafter = make_drafter(tiny_target, spec, GREEDY, make_generator(0), 64)
    assert drafter.backend.skipped == result["skip_layers"]
    plain = specdec.generate(tiny_target, PROMPTS[0], GREEDY)
    assert specdec.generate(tiny_target, PROMPTS[0], GREEDY, spec=spec).token_ids == plain.token_ids
    # a saved set that ran slower than plain decoding: calibrate-skip said so, and now each use says it again
    saved[0].write_text(json.dumps({**result, "speedup": 0.8}))
    with caplog.at_level(logging.WARNING, logger="specdec.drafters.layer_skip"):
        make_drafter(tiny_target, spec, GREEDY, make_generator(0), 64)
    assert "ran 0.80x plain decoding" in caplog.text


def test_cli_generate_with_layer_skip(tiny_dirs, capsys):
    from specdec.cli import main

    code = main(["generate", "def f(x):", "--model", str(tiny_dirs["target"]), "--dtype", "float32",
                 "--method", "early-exit", "--exit-layer", "2", "--max-tokens", "8", "--ignore-eos", "--compare-plain"])
    assert code == 0
    err = capsys.readouterr().err
    assert "draft_cost_ratio" in err and "identical text: yes" in err
