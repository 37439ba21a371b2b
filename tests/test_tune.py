"""`specdec tune`: measures the candidates on the user's prompts, picks an exact configuration, writes a
file generate/serve/bench read with --config (command-line flags win), exports it, and resumes."""

from __future__ import annotations

import json

import pytest

from specdec.bench.runner import RequestResult
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.tune import MIN_SPEEDUP, choose, read_settings


def result(method: str, prompt: str, tokens: int, wall: float, mismatch: bool = False) -> RequestResult:
    return RequestResult(prompt, "c", method, 0, 0, list(range(tokens)), {"acceptance_rate": 0.5}, wall, mismatch)


def test_choose_takes_the_fastest_exact_configuration_or_plain():
    runs = [result("ar", "p", 100, 10.0), result("ngram@auto", "p", 100, 8.0), result("suffix@3", "p", 100, 5.0, mismatch=True),
            result("draft_model@3", "p", 100, 6.0)]
    assert choose(runs)[:3] == ("draft_model", 3, "greedy")  # suffix was faster but changed the output
    runs.append(result("draft_model@3:tree=off", "p", 100, 5.5))  # chains, named as not the default
    assert choose(runs)[:3] == ("draft_model", 3, "off")
    slow = [result("ar", "p", 100, 10.0), result("ngram", "p", 100, 10.0 / (MIN_SPEEDUP - 0.01))]
    assert choose(slow)[:3] == (None, None, "off")


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def add(a, b):", "class Stack:", "for i in range("]))
    return path


def test_tune_writes_a_config_that_generate_reads_and_resumes(tiny_dirs, prompts, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("specdec.tune.slowed", lambda row_results, most=0: False)  # a busy CI core must not make it re-measure
    out = tmp_path / "tune"
    base = ["--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]), "--dtype", "float32",
            "--quantize", "none", "--prompts", str(prompts), "--max-tokens", "12", "--out", str(out)]
    assert main(["tune", *base, "--gammas", "auto,2", "--export", "vllm"]) == 0
    printed = capsys.readouterr().out
    assert "chosen:" in printed and (out / "report.md").is_file() and (out / "speedup.png").is_file()
    chosen = json.loads((out / "tune.json").read_text())
    table = chosen["measured"]["table"]["overall"]
    assert {"ar", "ngram@auto", "suffix@2", "draft_model@auto", "draft_suffix@2"} <= set(table)
    assert all(figures["mismatches"] == 0 for figures in table.values())
    assert chosen["measured"]["prompts"] == 3
    settings = read_settings(out / "tune.json")
    assert set(settings) >= {"method", "num_speculative_tokens", "model", "draft_model", "quantize"}
    if settings["method"] is not None:
        assert (out / "vllm.sh").read_text().startswith("# vLLM")
    lines = (out / "measurements.jsonl").read_text().count("\n")
    assert main(["tune", *base, "--gammas", "auto,2"]) == 0  # resumed: nothing measured again
    assert (out / "measurements.jsonl").read_text().count("\n") == lines
    assert "tune: 3 prompt(s) reused from" in capsys.readouterr().err
    # an edited prompt keeps its id (the line number) but is measured again: it reused the old text's figures
    prompts.write_text(prompts.read_text().replace("class Stack:", "while True:"))
    assert main(["tune", *base, "--gammas", "auto,2"]) == 0
    assert (out / "measurements.jsonl").read_text().count("\n") == lines + 1
    assert "tune: 2 prompt(s) reused from" in capsys.readouterr().err
    # answers stop where they end by default (tune timed text past <|im_end|>); --ignore-eos is another setup
    assert main(["tune", *base, "--gammas", "auto,2", "--ignore-eos"]) == 0
    err = capsys.readouterr().err
    assert "reused" not in err  # and it says why (the same --out measured everything again without a word)
    assert "holds prompts measured under other settings (ignore_eos: False → True): measuring again" in err
    entries = [json.loads(line) for line in (out / "measurements.jsonl").read_text().splitlines()]
    assert {entry["setup"]["ignore_eos"] for entry in entries} == {False, True}
    assert all(len(r["tokens"]) == 12 for entry in entries if entry["setup"]["ignore_eos"] for r in entry["results"])

    forced = dict(settings, method="ngram", num_speculative_tokens=3, draft_model=None)
    (out / "forced.json").write_text(json.dumps({"settings": forced}))
    assert main(["generate", "def f(x):", "--config", str(out / "forced.json"), "--max-tokens", "8", "--ignore-eos"]) == 0
    assert "method=ngram" in capsys.readouterr().err
    assert main(["generate", "def f(x):", "--config", str(out / "forced.json"), "--method", "suffix",
                 "--max-tokens", "8", "--ignore-eos"]) == 0  # a typed flag wins over the file
    assert "method=suffix" in capsys.readouterr().err


def test_bad_config_files_are_clear_errors(tmp_path, capsys):
    with pytest.raises(SpecdecError, match="no such file"):
        read_settings(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(SpecdecError, match="not JSON"):
        read_settings(tmp_path / "bad.json")
    (tmp_path / "odd.json").write_text(json.dumps({"settings": {"warp_drive": 9}}))
    assert main(["generate", "x", "--config", str(tmp_path / "odd.json")]) == 1
    assert "'warp_drive' is not a setting" in capsys.readouterr().err
    # values are checked as the flags' are: -1 started a server that answered every request with a 500
    for settings, message in (({"max_concurrency": -1}, "max_concurrency: must be >= 1, got -1"),
                              ({"max_concurrency": True}, "max_concurrency: expected a number or a word, got True"),
                              ({"quantize": "int9"}, "quantize: 'int9' is not one of"),
                              ({"no_pull": "yes"}, "no_pull: expected true or false"),
                              ({"host": None}, "host: null is not a value of --host"),
                              ({"num_speculative_tokens": 0}, "num_speculative_tokens: must be >= 1"),
                              ({"method": "draft_sufix"}, "odd.json: method: unknown speculative method 'draft_sufix'")):
        (tmp_path / "odd.json").write_text(json.dumps({"settings": settings}))
        assert main(["serve", "--config", str(tmp_path / "odd.json"), "--model", "/nope/m.gguf"]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_config_values_are_converted_as_typed_flags_are(tmp_path):
    from specdec.cli import build_parser, command_parser, typed_flags
    from specdec.cli.checks import apply_config

    (tmp_path / "ok.json").write_text(json.dumps({"settings": {"max_tokens": "8", "spec_tree": 6, "stop": ["END"],
                                                               "num_speculative_tokens": "auto", "draft_model": None}}))
    parser = build_parser()
    argv = ["generate", "x", "--config", str(tmp_path / "ok.json")]
    args = parser.parse_args(argv)
    apply_config(args, typed_flags(argv), command_parser(parser, "generate"))
    assert (args.max_tokens, args.spec_tree, args.stop, args.num_speculative_tokens, args.draft_model) == (8, 6, ["END"], "auto", None)
    (tmp_path / "ok.json").write_text(json.dumps({"settings": {"stop": "END"}}))
    with pytest.raises(SpecdecError, match="stop: expected a list"):
        apply_config(args, set(), command_parser(parser, "generate"))
    # bench and verify default to the 0.5B draft: a tune.json that chose no draft model ("draft_model": null) was refused
    (tmp_path / "ok.json").write_text(json.dumps({"settings": {"draft_model": None, "method": "suffix"}}))
    for command in ("bench", "verify"):
        argv = [command, "--config", str(tmp_path / "ok.json")]
        args = parser.parse_args(argv)
        apply_config(args, typed_flags(argv), command_parser(parser, command))
        assert args.draft_model is None


def test_a_typed_flag_equal_to_its_default_still_wins(tmp_path):
    from specdec.cli import typed_flags

    assert {"draft_model", "method"} <= typed_flags(["bench", "--draft-model", "qwen2.5-coder-0.5b", "--method", "ngram"])
    assert "draft_model" not in typed_flags(["bench"])


def test_measured_alpha_decides_the_execution_mode_worth_measuring():
    """int8's verification is flat (1 and 5 tokens cost about the same), int4's plain step is
    cheaper: with a high measured α int8 is expected faster, with none int4 is."""
    from specdec.cost_model import Curve, ModeChoice
    from specdec.step_costs import ExecutionPlan
    from specdec.tune import faster_mode, mode_rates

    curves = {"int8": Curve("int8", {1: 0.040, 5: 0.046, 9: 0.060}), "int4": Curve("int4", {1: 0.025, 5: 0.060, 9: 0.100})}
    plan = ExecutionPlan("int4", "int4-all", ModeChoice("int4", curves, {}, {}),
                         {"int4-all": Curve("int4-all", {1: 0.004, 5: 0.010})})
    high = mode_rates(plan, "suffix", 0.9)
    assert high.mode == "int8" and faster_mode(high, "int4") == "int8"
    plain = mode_rates(plan, None, 0.0)
    assert plain.mode == "int4" and faster_mode(plain, "int4") is None
    # a model drafter pays its measured draft step per token: a costly draft favours the cheaper plain step
    assert mode_rates(plan, "draft_model", 0.9).draft_seconds == 0.004
    assert mode_rates(plan, "suffix", 0.9).draft_seconds == 0.0
    assert mode_rates(ExecutionPlan("int8"), "suffix", 0.9) is None  # one candidate: nothing to choose


def test_draft_tokens_the_suffix_table_gave_free_are_not_priced_as_draft_steps():
    """draft_suffix drafts part of its tokens from its suffix table with no draft-model forward: the
    mode choice prices the forwards measured per drafted token, not one per token. With half of them
    free the flat int8 verification (longer drafts) becomes worth measuring; priced at one step per
    token it does not (session 43: int8 measured 1.24× int4 with draft_suffix on HumanEval)."""
    from specdec.bench.runner import summarize
    from specdec.cost_model import Curve, ModeChoice
    from specdec.step_costs import ExecutionPlan
    from specdec.tune import faster_mode, mode_rates

    curves = {"int8": Curve("int8", {1: 0.068, 2: 0.071, 4: 0.075, 8: 0.078}),
              "int4": Curve("int4", {1: 0.046, 2: 0.056, 4: 0.066, 8: 0.109})}
    plan = ExecutionPlan("int4", "int4-all", ModeChoice("int4", curves, {}, {}),
                         {"int4-all": Curve("int4-all", {1: 0.023, 2: 0.031})})
    every_token = mode_rates(plan, "draft_suffix", 0.9)
    assert every_token.draft_seconds == pytest.approx(0.023) and faster_mode(every_token, "int4") is None
    half_free = mode_rates(plan, "draft_suffix", 0.9, draft_forwards_per_token=0.4)
    assert half_free.draft_seconds == pytest.approx(0.4 * 0.023)
    assert faster_mode(half_free, "int4") == "int8" and half_free.gammas["int8"] > half_free.gammas["int4"]

    # a speculative choice is measured in the other mode even when not expected faster; plain decoding is not
    from specdec.tune import mode_to_measure

    assert mode_to_measure(every_token, "int4", "draft_suffix") == "int8"
    assert mode_to_measure(half_free, "int4", "draft_suffix") == "int8"
    assert mode_to_measure(mode_rates(plan, None, 0.0), "int4", None) is None
    assert mode_to_measure(None, "int4", "draft_suffix") is None

    def run(method: str, proposed: int, forwards: int | None, prompt: str) -> RequestResult:
        stats = {"acceptance_rate": 0.8, "proposed_tokens": proposed}
        if forwards is not None:
            stats["draft_forwards"] = forwards
        return RequestResult(prompt, "c", method, 0, 0, list(range(64)), stats, 2.0)

    overall = summarize([run("ar", 0, None, "a"), run("ar", 0, None, "b"), run("suffix", 30, None, "a"),
                         run("draft_suffix", 40, 10, "a"), run("draft_suffix", 60, 30, "b")])["overall"]
    assert overall["draft_suffix"]["draft_forwards_per_token"] == pytest.approx(40 / 100)  # a ratio of sums
    assert "draft_forwards_per_token" not in overall["suffix"] and "draft_forwards_per_token" not in overall["ar"]


def test_tune_writes_the_acceptance_view_of_its_choice(tiny_dirs, tiny_target, tmp_path):
    from specdec.bench.datasets import PromptRow
    from specdec.cli import build_parser
    from specdec.cli.tune import _acceptance_views
    from specdec.sampling import SamplingParams

    args = build_parser().parse_args(["tune", "--out", str(tmp_path)])
    rows = [PromptRow("humaneval/1", "code", ["def add(a, b):\n    return a + b\n\ndef add(a, b):"], False)]
    settings = {"method": "ngram", "num_speculative_tokens": 3, "draft_model": None}
    _acceptance_views(args, tiny_target, None, rows, settings, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    page = (tmp_path / "acceptance" / "humaneval_1.html").read_text()
    assert "<html" in page and "def add" in page


def test_the_target_mode_check_is_in_the_report():
    """tune's second pass (the chosen configuration timed in another target mode, beside plain decoding)
    was only in tune.json and one printed line: report.md shows both modes' figures."""
    from specdec.cli.tune import modes_section

    modes = {"measured_in": "int4", "expected_tok_s": {"int4": 24.0, "int8": 27.5}, "chosen": "int8",
             "measured_tok_s": {"int4": 25.1, "int8": 31.1}, "plain_tok_s": 19.0, "plain_mode": "int4",
             "plain_tok_s_by_mode": {"int4": 19.0, "int8": 16.4}}
    section = modes_section(modes)
    assert "| int8 (chosen) | 27.5 | 31.1 | 1.64× |" in section
    assert "| int4 | 24.0 | 25.1 | 1.32× |" in section
    assert "against plain decoding in int4" in section and "plain decoding: 19.0 tok/s in int4, 16.4 tok/s in int8" in section


def test_the_speedup_is_against_the_plain_decoding_a_user_gets():
    """tune timed plain decoding in the mode it speculated in (int8) and called 1.71x what int4 plain decoding, auto's
    plain mode, put at ~1.27x; a method that beats only the slower plain mode is not chosen."""
    from specdec.tune import MIN_SPEEDUP, against_plain

    modes = {"measured_tok_s": {"int8": 25.1, "int4": 21.0}, "plain_tok_s": 20.1, "plain_mode": "int4"}
    assert against_plain(modes, "int8") == pytest.approx(25.1 / 20.1)
    slower = dict(modes, measured_tok_s={"int8": 20.3, "int4": 19.0})  # 1.43x int8 plain (14.2), 1.01x int4's
    assert against_plain(slower, "int8") < MIN_SPEEDUP
    from specdec.cli.tune import modes_section
    from specdec.tune import settle_against_plain

    kept = settle_against_plain(dict(modes), "suffix", "auto", "off", "int8", {"speedup": 1.71, "acceptance_rate": 0.6})
    assert kept[:4] == ("suffix", "auto", "off", "int8") and kept[4]["speedup"] == pytest.approx(25.1 / 20.1)
    assert "against plain decoding in int4 (20.1 tok/s" in kept[5]
    dropped = dict(slower, chosen="int8", measured_in="int8", expected_tok_s={})
    method, gamma, tree, mode, figures, note = settle_against_plain(dropped, "suffix", "auto", "off", "int8",
                                                                    {"speedup": 1.43, "acceptance_rate": 0.6})
    assert (method, gamma, tree, mode, figures["speedup"]) == (None, None, "off", "int4", 1.0)
    assert note.startswith(": suffix ran 1.01× plain decoding in int4") and dropped["chosen"] == "int4"
    assert "(chosen)" not in modes_section(dropped)  # no speculative row is marked where plain decoding won
    budget_spent = {"measured_in": "int8", "note": "int4 was not measured: the budget was spent first"}
    assert settle_against_plain(budget_spent, "suffix", 4, "off", "int8", {"speedup": 1.5})[5] == (
        " (against plain decoding in int8: int4 was not measured: the budget was spent first)")


def test_a_resumed_tune_measures_again_the_prompts_other_processes_slowed():
    """A slowed plain run lowered the baseline, and rerunning with the same --out (as the report advised) reused it."""
    from specdec.bench.runner import RequestResult
    from specdec.tune import slowed

    def run(low: int, high: int) -> RequestResult:
        return RequestResult("p", "code", "ar", 0, 0, [1], {"threads_min": low, "threads_max": high}, 0.1)

    assert not slowed([run(2, 2), run(2, 2)]) and not slowed([])
    assert slowed([run(1, 2), run(2, 2)]) and slowed([run(1, 1), run(2, 2)])
    assert slowed([run(1, 1), run(1, 1)], most=2) and not slowed([run(2, 2)], most=2)  # a whole prompt on one core


def test_a_resumed_tune_reuses_its_second_pass_in_the_other_mode(tiny_dirs, prompts, tmp_path, capsys, monkeypatch):
    """The second pass (the chosen configuration and plain decoding timed again, in the other target mode) was
    measured afresh on every resumed run — 54 of a walkthrough's 90 s — and overwrote the first run's figures."""
    from specdec.cost_model import Curve, ModeChoice
    from specdec.step_costs import ExecutionPlan

    curves = {mode: Curve(mode, {1: 0.01, 4: 0.02}) for mode in ("int8", "int4")}
    choice = ModeChoice("int8", curves, {"int8": 30.0, "int4": 25.0}, {"int8": 3, "int4": 3})
    monkeypatch.setattr("specdec.api.plan_execution", lambda *a, **k: ExecutionPlan("int8", "int8", choice))
    monkeypatch.setattr("specdec.tune.mode_to_measure", lambda rates, measured, method: "int4")
    monkeypatch.setattr("specdec.tune.slowed", lambda row_results, most=0: False)  # a busy CI core must not re-measure
    out = tmp_path / "tune"
    args = ["tune", "--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]), "--dtype", "float32",
            "--quantize", "auto", "--prompts", str(prompts), "--max-tokens", "8", "--out", str(out), "--methods", "suffix",
            "--gammas", "2"]
    assert main(args) == 0
    assert "tune: measuring the chosen configuration with the target in int4" in capsys.readouterr().err
    entries = [json.loads(line) for line in (out / "measurements.jsonl").read_text().splitlines()]
    second = [entry for entry in entries if entry["setup"].get("pass") == "modes"]
    assert sorted(entry["setup"]["mode"] for entry in second) == ["int4"] * 3 + ["int8"] * 3
    first = json.loads((out / "tune.json").read_text())["measured"]["execution_modes"]
    assert set(first["measured_tok_s"]) == {"int4", "int8"}
    assert main(args) == 0  # resumed: neither pass measures anything again, and the figures are the stored ones
    err = capsys.readouterr().err
    assert "tune: 3 prompt(s) reused from" in err and "tune: 3 prompt(s) of the int4 pass reused from" in err
    assert len((out / "measurements.jsonl").read_text().splitlines()) == len(entries)
    again = json.loads((out / "tune.json").read_text())["measured"]["execution_modes"]
    assert again["measured_tok_s"] == first["measured_tok_s"] and again["chosen"] == first["chosen"]


def test_tree_settings_that_verify_alike_are_measured_once():
    """On a target whose verify cost grows per row, "greedy" trees are chains: tune timed them twice, as "off" and
    as "greedy", and chose between identical configurations on noise (1.52x vs 1.14x in a walkthrough)."""
    from specdec.tune import distinct_trees

    steep = {rows: 0.03 * (1 + 0.2 * (rows - 1)) for rows in range(1, 33)}
    flat = {rows: 0.03 for rows in range(1, 33)}
    assert distinct_trees(["off", "greedy"], ["auto", 2], steep) == (["greedy"], [("off", "greedy")])
    assert distinct_trees(["greedy", "off"], [4], steep) == (["greedy"], [("off", "greedy")])
    assert distinct_trees(["off", "greedy", 5], [4], flat) == (["off", "greedy", 5], [])
    assert distinct_trees(["off", 8, "auto"], [4], steep) == (["off", 8, "auto"], [])  # only greedy is gated by the curve
    assert distinct_trees(["off", "off", "greedy"], [4], steep) == (["greedy"], [("off", "greedy")])  # each once


def test_the_measure_again_note_names_the_first_pass_change(tmp_path):
    """The file also holds tune's second pass (its setup has pass, mode, method … of its own): the note compared with
    the last entry, one of those, and listed five changes around the real one."""
    from specdec.tune import MeasurementStore

    first = {"model": "m", "execution": ["int4", "int8"], "trees": ["off", "greedy"]}
    second = {**first, "pass": "modes", "mode": "int8", "method": "draft_suffix", "gamma": 4, "tree": "off"}
    lines = [{"setup": first, "prompt": "p", "results": []}, {"setup": second, "prompt": "p", "results": []}]
    (tmp_path / "measurements.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    changed = MeasurementStore(tmp_path, {**first, "execution": ["int4", "int4"]}).setup_change()
    assert changed == "execution: ['int4', 'int8'] → ['int4', 'int4']"
    assert MeasurementStore(tmp_path, first).setup_change() is None  # reused: nothing to say


def test_a_plain_decoding_choice_writes_no_tree_setting(tmp_path, capsys):
    """tune.json of a plain-decoding choice held spec_tree "off": generate and serve then warned that plain decoding
    does not read --spec-tree, a flag nobody typed."""
    from specdec.tune import config_file

    plain = config_file(None, None, "auto", {"model": "m", "draft_model": "d"}, {}, {}, {}, tree="off")["settings"]
    assert "spec_tree" not in plain and plain["method"] is None and plain["draft_model"] is None
    chosen = config_file("ngram", 3, "auto", {"model": "m"}, {}, {}, {}, tree="off")["settings"]
    assert chosen["spec_tree"] == "off" and chosen["num_speculative_tokens"] == 3
    (tmp_path / "tune.json").write_text(json.dumps({"settings": plain}))
    from specdec.cli import main

    main(["generate", "--config", str(tmp_path / "tune.json"), "--model", "/nonexistent-model", "x"])
    assert "spec-tree" not in capsys.readouterr().err
