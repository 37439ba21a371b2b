"""`specdec verify`: the distribution certificate passes for every drafter and has the power to fail."""

from __future__ import annotations

import pytest

import specdec.verify as verify_module
from specdec.certify import DISTRIBUTION_CONFIGS, distribution_check, format_table, registered_methods
from specdec.cli import main


@pytest.mark.parametrize("config", sorted(DISTRIBUTION_CONFIGS))
@pytest.mark.parametrize("method", ["ar", *registered_methods()])
def test_distribution_certificate_passes(method, config):
    result = distribution_check(method, config, DISTRIBUTION_CONFIGS[config], samples=2500)
    assert result.passed, result.detail


def test_a_broken_verifier_fails_the_certificate(monkeypatch):
    """Sampling the correction from p instead of norm(max(p - q, 0)) is a classic bug: it must be caught."""

    def broken_residual(p, q, token):
        return p

    monkeypatch.setattr(verify_module, "_residual", broken_residual)
    result = distribution_check("draft_model", "T=1", DISTRIBUTION_CONFIGS["T=1"], samples=2500)
    assert not result.passed, result.detail


def test_cli_verify_distribution_only(capsys):
    code = main(["verify", "--skip-greedy", "--samples", "800", "--methods", "draft_model"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASS" in out and "FAIL" not in out.replace("0 failed", "")
    assert "800 samples, " in out and " drafted, " in out  # each row says the drafts exercised the rule


def test_verify_reads_method_names_as_every_command_does(capsys):
    """``layer-skip`` and aliases (``draft``) were "unknown methods" to verify alone; each runs once."""
    assert main(["verify", "--skip-greedy", "--samples", "200", "--methods", "layer-skip,draft,draft_model"]) == 0
    rows = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("distribution")]
    assert rows == ["layer_skip", "draft_model"]
    assert main(["verify", "--skip-greedy", "--methods", "ar"]) == 1
    assert "plain decoding is what every method is checked against" in capsys.readouterr().err


def test_the_quick_default_runs_one_configuration_and_thorough_all(capsys):
    """The default certificate is the quick one (minutes); --thorough adds the other configurations."""
    from specdec.certify import DISTRIBUTION_CONFIGS, QUICK_CONFIGS

    assert main(["verify", "--skip-greedy", "--samples", "300", "--methods", "ngram"]) == 0
    quick = [line for line in capsys.readouterr().out.splitlines() if line.startswith("distribution")]
    assert [line.split()[2] for line in quick] == list(QUICK_CONFIGS)
    assert main(["verify", "--skip-greedy", "--samples", "300", "--methods", "ngram", "--thorough"]) == 0
    thorough = [line for line in capsys.readouterr().out.splitlines() if line.startswith("distribution")]
    assert len(thorough) == len(DISTRIBUTION_CONFIGS)


def test_format_table_marks_failures():
    from specdec.certify import CheckResult

    table = format_table([CheckResult("distribution", "x", "T=1", False, "p=0")])
    assert "FAIL" in table


def test_a_trained_heads_method_without_its_head_is_a_skipped_row_not_a_silent_gap(tiny_target, tmp_path):
    """`verify` without --drafter-path listed no greedy row for eagle/medusa and still said "all passed";
    with an eagle head, 'all' failed on medusa. Now each is a SKIP row saying why, and the head's own
    kind is certified."""
    from specdec.certify import run_certificate
    from specdec.models.head_files import save_head
    from tests.test_heads import random_head

    results = run_certificate(tiny_target, None, ["eagle", "medusa", "ngram"], prompts=1, max_tokens=6, samples=10,
                              distribution=False)
    rows = {r.method: r for r in results}
    assert rows["eagle"].skipped and "needs --drafter-path" in rows["eagle"].detail and not rows["ngram"].skipped
    assert "SKIP" in format_table(results)
    head = save_head(random_head(tiny_target, draft_vocab_size=300), tmp_path / "eagle")
    rows = {r.method: r for r in run_certificate(tiny_target, None, ["eagle", "medusa"], prompts=1, max_tokens=6,
                                                 samples=10, distribution=False, drafter_path=str(head))}
    assert rows["eagle"].passed and not rows["eagle"].skipped
    assert rows["medusa"].skipped and "holds an eagle head" in rows["medusa"].detail
    assert "holds an eagle head, not a medusa head" in rows["medusa"].detail


def test_verify_certifies_the_configuration_given_and_names_it(tiny_target):
    """`verify --skip-layers 4,5` was refused (and --datastore, --prompt-lookup-*, --draft-vocab-size …): the
    greedy check ran each method's defaults only and its row said neither γ nor the options. Now the method
    flags reach the methods that read them, and the CONFIG column names them."""
    from specdec.certify import run_certificate

    results = run_certificate(tiny_target, None, ["layer_skip", "ngram"], prompts=1, max_tokens=6, samples=10, gamma=3,
                              distribution=False, options={"skip_layers": [1], "prompt_lookup_max": 2})
    rows = {r.method: r for r in results}
    assert rows["layer_skip"].config == "greedy float32, γ=3, tree=greedy, skip_layers=[1]", rows["layer_skip"].config
    assert rows["ngram"].config == "greedy float32, γ=3, tree=greedy, prompt_lookup_max=2"
    assert all(r.passed for r in results)


def test_verify_checks_your_own_traffic_and_a_tune_file_without_a_draft_model(tiny_dirs, tmp_path, capsys):
    """`verify` only read its built-in prompts (`--dataset FILE` was refused), and a tune.json that chose plain or
    suffix decoding ("draft_model": null) was refused by verify and bench, whose flag has a default pair."""
    import json

    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text("".join(json.dumps(row) + "\n" for row in [
        {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):"}]},
        {"conversations": [{"from": "human", "value": "a b a b a b"}, {"from": "gpt", "value": "a b"},
                           {"from": "human", "value": "again"}]}]))
    base = ["verify", "--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]), "--quantize", "none",
            "--skip-distribution", "--max-tokens", "6", "--methods", "ngram,draft_suffix"]
    assert main([*base, "--dataset", str(traffic)]) == 0
    out = capsys.readouterr().out
    assert "2/2 prompts identical" in out and out.count("PASS") == 2
    assert main([*base, "--dataset", str(traffic), "--limit", "1"]) == 0
    assert "1/1 prompts identical" in capsys.readouterr().out
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}) + "\n")
    assert main([*base, "--dataset", str(broken)]) != 0
    assert "broken.jsonl:1: message 0's role 'wizard'" in capsys.readouterr().err
    config = tmp_path / "tune.json"
    config.write_text(json.dumps({"settings": {"model": str(tiny_dirs["target"]), "draft_model": None, "method": None,
                                               "num_speculative_tokens": 4, "quantize": "none"}}))
    assert main(["verify", "--config", str(config), "--skip-distribution", "--max-tokens", "6", "--dataset", str(traffic),
                 "--methods", "ngram,draft_suffix"]) == 0
    out = capsys.readouterr().out
    assert "needs a draft model" in out and "SKIP" in out and "2/2 prompts identical" in out
