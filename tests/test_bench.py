"""`specdec bench` harness on a tiny model and a 3-row dataset."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specdec.bench import runner
from specdec.bench.datasets import load_prompts
from specdec.cli import main
from specdec.errors import SpecdecError


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [
        {"id": "a", "category": "code", "prompt": "def fibonacci(n):", "chat": False},
        {"id": "b", "category": "code", "prompt": "for i in range(10):\n    print(i)\nfor i in range(10):\n", "chat": False},
        {"id": "c", "category": "chat", "turns": ["The quick brown fox", "again, please"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_bench_writes_results_report_and_plots(tiny_dirs, dataset, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["bench", "--dataset", str(dataset), "--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]),
                 "--methods", "ar,draft,ngram,suffix", "--gammas", "2,4", "--repeats", "2", "--max-tokens", "12",
                 "--dtype", "float32", "--quantize", "none", "--ignore-eos", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    payload = json.loads((out / "results.json").read_text())
    overall = payload["summary"]["overall"]
    assert {"ar", "draft@2", "draft@4", "ngram@2", "suffix@4"} <= set(overall)
    assert overall["ar"]["speedup"] == pytest.approx(1.0)
    assert all(m["mismatches"] == 0 for m in overall.values())
    # the chat row ran both turns
    assert {r["turn"] for r in payload["requests"] if r["prompt_id"] == "c"} == {0, 1}
    for name in ("report.md", "speedup.png", "accepted_len.png", "speedup_vs_gamma.png"):
        assert (out / name).stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "| code | draft@2 |" in report
    from specdec.cpu import cpu_description

    assert f"Machine: {cpu_description()}" in report  # results differ by CPU: the flags are in every report
    capsys.readouterr()
    assert main(["bench", "--compare", str(out), str(out)]) == 0
    captured = capsys.readouterr()
    assert "+0.0%" in captured.out and "warning" not in captured.err
    assert main(["bench", "--compare", str(out), str(out), "--limit", "3", "--gammas", "2"]) == 0
    assert "warning: --gammas, --limit not read with --compare" in capsys.readouterr().err


def test_bench_with_penalties_names_them_and_refuses_the_peers(tiny_dirs, dataset, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["bench", "--dataset", str(dataset), "--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]),
            "--gammas", "3", "--repeats", "1", "--max-tokens", "10", "--dtype", "float32", "--quantize", "none", "--ignore-eos", "--out", str(out),
            "--repetition-penalty", "1.2", "--presence-penalty", "0.5"]
    assert main([*args, "--methods", "ar,draft", "--llama-bin", str(tmp_path)]) == 0
    assert "warning: --llama-bin is read only by the llama.cpp peers" in capsys.readouterr().err
    report = (out / "report.md").read_text()
    assert "repetition penalty 1.2, presence penalty 0.5," in report
    assert all(m["mismatches"] == 0 for m in json.loads((out / "results.json").read_text())["summary"]["overall"].values())
    assert main([*args, "--methods", "ar,hf"]) != 0
    assert "the peers (hf) define them differently" in capsys.readouterr().err
    stop = [a for a in args if a not in ("--repetition-penalty", "1.2", "--presence-penalty", "0.5")] + ["--stop-token-id", "3"]
    assert main([*stop, "--methods", "ar,hf"]) != 0
    assert "--stop-token-id: the peers (hf) do not read it" in capsys.readouterr().err


def test_bench_runs_chains_and_trees_side_by_side(tiny_dirs, dataset, tmp_path, capsys):
    out = tmp_path / "trees"
    code = main(["bench", "--dataset", str(dataset), "--model", str(tiny_dirs["target"]), "--methods", "ar,ngram,suffix",
                 "--spec-trees", "off,auto", "--repeats", "1", "--max-tokens", "12", "--dtype", "float32", "--quantize", "none",
                 "--ignore-eos", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    overall = json.loads((out / "results.json").read_text())["summary"]["overall"]
    # a run at the default trees ("greedy") has the plain name; others say which trees they ran
    assert {"ar", "ngram:tree=off", "ngram:tree=auto", "suffix:tree=off", "suffix:tree=auto"} == set(overall)
    assert all(m["mismatches"] == 0 for m in overall.values())
    assert main(["bench", "--dataset", str(dataset), "--model", str(tiny_dirs["target"]), "--spec-trees", "off,bushy",
                 "--out", str(out)]) != 0
    assert "--spec-trees" in capsys.readouterr().err


class AlteringDrafterRunner:
    """A deliberately wrong 'method': changes one token of plain decoding's output."""

    def __call__(self, target, draft, method, config, gamma=4, tree="off"):
        plain = runner.ours(target, draft, "ar", config)

        def generate_one(ids):
            tokens, stats, text = plain(ids)
            tokens = tokens[:3] + [(tokens[3] + 1) % 400] + tokens[4:]
            return tokens, stats, text

        return generate_one


def test_a_wrong_method_is_flagged_as_mismatch(tiny_target, dataset):
    from specdec.sampling import SamplingParams

    rows = load_prompts(str(dataset))
    config = runner.BenchConfig(methods=["ar", "broken"], params=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), repeats=1)
    results = runner.run_benchmark(tiny_target, None, rows, config, progress=False, method_runner=AlteringDrafterRunner())
    summary = runner.summarize(results)
    assert summary["overall"]["broken"]["mismatches"] == 4  # 2 single-turn rows + 2 turns of the chat row
    assert summary["overall"]["ar"]["mismatches"] == 0


def test_a_method_on_another_target_mode_is_checked_against_that_modes_plain_row(tiny_dirs, tiny_target, dataset):
    """``--quantize auto`` may run a method on the target in another mode (int8 verifies more tokens per step
    where int4 decodes one faster): its greedy output is then plain decoding's in that mode, a row of its own
    (``ar[int8]``), not the float target's — and a method that changes a token is still caught there."""
    import specdec
    from specdec.sampling import SamplingParams

    int8 = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int8")
    rows = load_prompts(str(dataset))
    config = runner.BenchConfig(methods=["ngram", "suffix"], params=SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                                gammas=[3], repeats=1)
    results = runner.run_benchmark(tiny_target, None, rows, config, progress=False, method_targets={"ngram": int8})
    by = {(r.method, r.prompt_id, r.turn): r.tokens for r in results}
    assert {r.method for r in results} == {"ar", "ar[int8]", "ngram", "suffix"}
    assert not any(r.mismatch for r in results)
    for (method, prompt, turn), tokens in by.items():
        if method == "ngram":
            assert tokens == by[("ar[int8]", prompt, turn)]
    assert runner.summarize(results)["overall"]["ngram"]["speedup"] > 0  # against "ar", the target's plain decoding
    broken = runner.run_benchmark(tiny_target, None, rows, dataclasses.replace(config, methods=["broken"]), progress=False,
                                  method_runner=AlteringDrafterRunner(), method_targets={"broken": int8})
    assert sum(r.mismatch for r in broken if r.method == "broken") == 4


def test_bench_runs_each_method_in_the_mode_auto_picks_for_it(tiny_dirs, dataset, tmp_path, monkeypatch, capsys):
    """The CLI loads the target once per mode ``--quantize auto`` picks (as ``specdec generate`` would run
    each method) and says so in the report's execution line."""
    import types

    import specdec.api

    loads = []

    def plan(model, draft_model=None, method=None, concurrency=1, **_):
        loads.append(concurrency)
        return types.SimpleNamespace(target_mode="int8" if method == "ngram" else "none", draft_mode=None)

    monkeypatch.setattr(specdec.api, "plan_execution", plan)
    out = tmp_path / "modes"
    code = main(["bench", "--dataset", str(dataset), "--model", str(tiny_dirs["target"]), "--methods", "ar,ngram,suffix",
                 "--gammas", "3", "--repeats", "1", "--max-tokens", "10", "--dtype", "float32", "--ignore-eos",
                 "--device", "cpu", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    payload = json.loads((out / "results.json").read_text())
    assert set(payload["summary"]["overall"]) == {"ar", "ar[int8]", "ngram", "suffix"}
    assert all(m["mismatches"] == 0 for m in payload["summary"]["overall"].values())
    assert payload["meta"]["execution"].startswith("float32; ngram on the target in int8")
    # throughput mode: the modes a server with --max-num-seqs 2 would pick, the same rows
    code = main(["bench", "--dataset", str(dataset), "--model", str(tiny_dirs["target"]), "--methods", "ar,ngram,suffix",
                 "--gammas", "3", "--repeats", "1", "--max-tokens", "10", "--dtype", "float32", "--ignore-eos",
                 "--device", "cpu", "--concurrency", "2", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    overall = json.loads((out / "results.json").read_text())["summary"]["overall"]
    assert set(overall) == {"ar", "ar[int8]", "ngram", "suffix"} and loads[-1] == 2
    assert all(m["mismatches"] == 0 for m in overall.values())


def test_a_peer_without_speculation_figures_shows_dashes_not_invented_ones(tiny_target, dataset):
    """transformers' runs report only their tokens: the report showed α 0.00, τ 1.00 and 0 mismatches for
    them (hf-assisted does speculate, and a peer's output is never checked)."""
    from specdec.bench.report import markdown_report
    from specdec.sampling import SamplingParams

    rows = load_prompts(str(dataset))[:1]
    config = runner.BenchConfig(methods=["ar", "hf-assisted"], params=SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                                repeats=1)
    plain = runner.ours(tiny_target, None, "ar", config)

    def peer(ids):
        tokens, _, text = plain(ids)
        return tokens, {"generated_tokens": len(tokens)}, text

    summary = runner.summarize(runner.run_benchmark(tiny_target, None, rows, config, peers={"hf-assisted": peer},
                                                    progress=False))
    report = markdown_report(summary, {"model": "tiny"})
    assert "| code | hf-assisted |" in report
    peer_line = next(line for line in report.splitlines() if line.startswith("| code | hf-assisted |"))
    cells = [cell.strip() for cell in peer_line.split("|")]  # "", category, method, tok/s, speedup, decode, α, τ, …
    assert cells[6] == "–" and cells[7] == "–" and cells[10] == "–"  # α, τ not reported; mismatches not checked
    ours = [cell.strip() for cell in next(line for line in report.splitlines() if line.startswith("| code | ar |")).split("|")]
    assert ours[6] == "–" and ours[10] == "0"  # plain decoding drafts nothing: no α (it read 0.00); its output is checked


def test_bad_dataset_inputs_are_clear(tmp_path):
    with pytest.raises(SpecdecError, match="dataset file not found"):
        load_prompts(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(SpecdecError, match=r"bad.jsonl:2: malformed JSON"):
        load_prompts(str(bad))
    bad.write_text('{"prompt": "a\tb"}\n')  # a raw tab in a string: the message ended "(Invalid control character at)"
    with pytest.raises(SpecdecError, match=r"bad.jsonl:1: malformed JSON \(Invalid control character at column 14\)"):
        load_prompts(str(bad))
    bad.write_text('{"nothing": 1}\n')
    with pytest.raises(SpecdecError, match=r"bad.jsonl:1: needs a 'prompt'"):
        load_prompts(str(bad))
    with pytest.raises(SpecdecError, match="unknown categories"):
        load_prompts("spec_bench", categories=["poetry"])
    bad.write_text('{"prompt": "hi", "chat": null}\n')  # null: unset, the default
    assert load_prompts(str(bad))[0].chat
    bad.write_text('{"prompt": "hi", "chat": "false"}\n')  # a string: it was true, the raw prompt went through the template
    with pytest.raises(SpecdecError, match=r"bad.jsonl:1: 'chat' must be true or false, got 'false'"):
        load_prompts(str(bad))
    (tmp_path / "one.json").write_text('{"prompt": "hi"}')  # not an array: no advice to use .txt, which bench cannot read
    with pytest.raises(SpecdecError, match=r"one.json: a .json file must hold one array of objects") as raised:
        load_prompts(str(tmp_path / "one.json"))
    assert ".txt" not in str(raised.value)
    # a named dataset where the data folder is not: how to point at it (a clone elsewhere than beside ../shared)
    with pytest.raises(SpecdecError, match=r"dataset humaneval: .* not found; give the folder .* with --data-dir"):
        load_prompts("humaneval", data_dir=tmp_path)


def test_logged_conversations_are_prompts_as_their_requests_asked(tiny_dirs, tmp_path, capsys):
    """A user's own traffic — OpenAI chat requests (a system prompt, earlier exchanges, the logged answer) or ShareGPT
    conversations — is a prompt set for bench/tune/verify: each row's prompt is its messages up to the last user
    message, the logged answer left out (they needed a 'prompt' or 'turns' field: the system prompt was lost)."""
    import specdec

    system = {"role": "system", "content": "You answer in Python only."}
    rows = [
        {"id": "req-1", "messages": [system, {"role": "user", "content": "Reverse a list."},
                                     {"role": "assistant", "content": "xs[::-1]"}, {"role": "user", "content": "And a string?"},
                                     {"role": "assistant", "content": "s[::-1]"}], "temperature": 0.7},  # the logged answer
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Sum 1..10 in Python."}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Sort "}, {"type": "text", "text": "a dict."}]}]},
    ]
    path = tmp_path / "traffic.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    loaded = load_prompts(str(path))
    assert [r.turns for r in loaded] == [["And a string?"], ["Sum 1..10 in Python."], ["Sort a dict."]]
    assert loaded[0].first_prompt() == [system, {"role": "user", "content": "Reverse a list."},
                                        {"role": "assistant", "content": "xs[::-1]"}, {"role": "user", "content": "And a string?"}]
    assert loaded[1].first_prompt() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sum 1..10 in Python."}]
    assert loaded[2].first_prompt() == "Sort a dict." and loaded[2].chat
    assert loaded[0].meta == {"temperature": 0.7} and loaded[1].meta == {}  # tune says it measures greedy

    out = tmp_path / "out"
    assert main(["bench", "--dataset", str(path), "--model", str(tiny_dirs["target"]), "--methods", "ar,ngram", "--gammas", "2",
                 "--repeats", "1", "--max-tokens", "6", "--dtype", "float32", "--quantize", "none", "--ignore-eos",
                 "--out", str(out)]) == 0, capsys.readouterr().err
    payload = json.loads((out / "results.json").read_text())
    target = specdec.load_model(tiny_dirs["target"], dtype="float32", quantize="none")
    expected = len(specdec.api.encode_prompt(target, loaded[0].first_prompt()))
    first = next(r for r in payload["requests"] if r["prompt_id"] == "req-1" and r["method"] == "ar")
    assert first["stats"]["prompt_tokens"] == expected  # the whole logged conversation, system prompt included
    report = (out / "report.md").read_text()
    assert "| default | ar |" in report and "| overall |" not in report  # one category: its rows once, not twice

    for bad, message in (({"messages": [system]}, "the conversation must end with a non-empty user message"),
                         ({"messages": [{"role": "user"}]}, "message 0 needs a 'role' and a text 'content'"),
                         ({"conversations": [{"from": "bot", "value": "hi"}]}, "conversations\\[0\\] needs 'from'"),
                         ({"conversations": [{"from": "human"}]}, "conversations\\[0\\] needs .* a text 'value'"),
                         ({"messages": [{"role": "sytem", "content": "x"}, {"role": "user", "content": "hi"}]},
                          "message 0's role 'sytem' is not one of"),  # was found after loading, unnamed
                         ({"messages": [{"role": "user", "content": "Weather?"},
                                        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
                                        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                                        {"role": "user", "content": "So?"}]}, "message 1 is a tool-calling turn")):
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(SpecdecError, match=rf"traffic.jsonl:1: {message}"):
            load_prompts(str(path))


def test_an_mt_bench_category_is_reported_under_its_own_name():
    """``--categories writing,rag`` picks MT-Bench's writing questions and the rag group: each reported
    under the name asked for (they were labelled ``mt_bench``), ``--limit`` per each."""
    rows = load_prompts("spec_bench", categories=["writing", "coding", "rag"], limit=3)
    assert sorted({row.category for row in rows}) == ["coding", "rag", "writing"]
    assert [row.category for row in rows].count("writing") == 3
    assert all(row.meta["category"] == "writing" for row in rows if row.category == "writing")
    assert {row.category for row in load_prompts("spec_bench", categories=["mt_bench"], limit=2)} == {"mt_bench"}


def test_compare_says_where_two_runs_measured_different_work(tmp_path):
    """``bench --compare`` of runs over different datasets, prompts or models prints a note per difference
    above the table (it compared them silently, as if only the code had changed)."""
    from specdec.bench.report import compare_runs

    def run(name: str, dataset: str, prompts: list[str], categories: list[str]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        summary = {category: {"ar": {"tokens_per_s": 10.0, "speedup": 1.0}} for category in categories}
        requests = [{"category": categories[0], "prompt_id": prompt} for prompt in prompts]
        (folder / "results.json").write_text(json.dumps({"meta": {"dataset": dataset, "model": "m"}, "summary": summary,
                                                         "requests": requests}))
        return folder

    same = compare_runs(run("a", "humaneval", ["1", "2"], ["humaneval"]), run("b", "humaneval", ["1", "2"], ["humaneval"]))
    assert "note" not in same and "+0.0%" in same
    other = compare_runs(run("c", "humaneval", ["1", "2"], ["humaneval", "x"]), run("d", "mine.jsonl", ["2", "3", "4"], ["humaneval"]))
    assert "note: the runs differ in dataset: 'humaneval' vs 'mine.jsonl'" in other
    assert "note: humaneval ran different prompts (2 vs 3, 1 in common)" in other
    assert "note: only run 1 has x" in other


def test_repeats_do_not_draft_from_their_own_earlier_output(tiny_target, dataset):
    """Suffix decoding's cross-request cache must not see an earlier repeat of the same prompt: every
    repeat of a prompt drafts (and accepts) exactly as the first did."""
    from specdec.sampling import SamplingParams

    rows = load_prompts(str(dataset))[:2]
    config = runner.BenchConfig(methods=["ar", "suffix"], params=SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                                repeats=3)
    results = runner.run_benchmark(tiny_target, None, rows, config, progress=False)
    for row in rows:
        accepted = {r.stats["accepted_tokens"] for r in results if r.prompt_id == row.id and r.method != "ar"}
        assert len(accepted) == 1, accepted


def test_the_report_says_which_requests_did_not_draft_and_why():
    """A method row with α 0 is either a drafter that never agreed or one γ=auto never asked: the report
    tells them apart with the engine's reason."""
    from specdec.bench.report import drafting_notes, markdown_report
    from specdec.bench.runner import RequestResult

    note = "not drafting: the draft's pass over the prompt (~250 ms measured cost) would not be paid back by 95 more tokens"
    results = [RequestResult("p0", "code", "draft", 0, 0, [1], {"speculation_note": note}, 0.1),
               RequestResult("p1", "code", "draft", 0, 0, [1], {}, 0.1),
               RequestResult("p0", "code", "ar", 0, 0, [1], {}, 0.1)]
    notes = drafting_notes(results)
    assert notes == [f"draft: 1 of 2 requests did not draft — {note}"]
    summary = {"overall": {"draft": {"tokens_per_s": 1.0, "speedup": 1.0, "acceptance_rate": 0.0, "mean_accepted_len": 1.0,
                                     "ttft_s": 0.1, "tpot_s": 0.01, "mismatches": 0}}}
    report = markdown_report(summary, {"dataset": "x"}, notes)
    assert "Not drafting (γ=auto):" in report and notes[0] in report
    assert "Not drafting" not in markdown_report(summary, {"dataset": "x"})


def test_the_report_warns_when_other_processes_took_cores():
    """On a shared machine a run on fewer threads made noise look like a speedup (α 0 at 1.6x), without a word."""
    from specdec.bench.report import busy_note, markdown_report
    from specdec.bench.runner import RequestResult

    def result(method: str, low: int, high: int) -> RequestResult:
        return RequestResult("p0", "code", method, 0, 0, [1], {"threads_min": low, "threads_max": high}, 0.1)

    assert busy_note([result("ar", 2, 2), result("ngram", 2, 2)]) == ""
    assert busy_note([result("ar", 2, 2), RequestResult("p0", "code", "hf", 0, 0, [1], {}, 0.1)]) == ""  # peers: unknown
    note = busy_note([result("ar", 1, 2), result("ngram", 2, 2), result("suffix", 1, 1)])
    assert "during 2 of 3 runs" in note and "fewer than 2 threads" in note
    # a neighbour through every run: all at 1 thread of the 2 the process chose (the most any run had was 1)
    assert "during 2 of 2 runs" in busy_note([result("ar", 1, 1), result("ngram", 1, 1)], threads=2)
    assert busy_note([result("ar", 1, 1)], threads=1) == ""  # --threads 1 asked for one
    summary = {"overall": {"ar": {"tokens_per_s": 1.0, "speedup": 1.0, "acceptance_rate": 0.0, "mean_accepted_len": 1.0,
                                  "ttft_s": 0.1, "tpot_s": 0.01, "mismatches": 0}}}
    assert note in markdown_report(summary, {"dataset": "x"}, busy=note)


def test_gamma_plot_draws_auto_and_compare_names_methods_one_run_lacks(tmp_path):
    """`--gammas 2,auto` drew one point at γ=2 (auto left out); `--compare` dropped rows only one run had, unsaid."""
    import json

    from specdec.bench.report import compare_runs, write_plots

    def figures(speedup: float) -> dict:
        return {"tokens_per_s": 10.0 * speedup, "speedup": speedup, "acceptance_rate": 0.5, "mean_accepted_len": 2.0,
                "ttft_s": 0.1, "tpot_s": 0.01, "mismatches": 0}

    summary = {"overall": {"ar": figures(1.0), "ngram@2": figures(1.2), "ngram@auto": figures(1.3)}}
    write_plots(tmp_path, [], summary)
    assert (tmp_path / "speedup_vs_gamma.png").stat().st_size > 0
    (tmp_path / "speedup_vs_gamma.png").unlink()
    write_plots(tmp_path, [], {"overall": {"ar": figures(1.0), "ngram@2": figures(1.2)}})  # one γ: nothing to draw
    assert not (tmp_path / "speedup_vs_gamma.png").exists()

    for name, overall, meta in (("a", {"ar": figures(1.0), "ngram": figures(1.2)}, {"repeats": 2}),
                                ("b", {"ar": figures(1.0), "ngram@auto": figures(1.2)}, {"repeats": 1})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"meta": meta, "summary": {"overall": overall}}))
    text = compare_runs(tmp_path / "a", tmp_path / "b")
    assert "note: the runs differ in repeats: 2 vs 1" in text
    assert "note: only run 1 ran ngram: not in the table" in text and "note: only run 2 ran ngram@auto" in text

    # one method spelt two ways (bench's default list says draft-suffix, a --config run draft_suffix): compared
    for name, method in (("c", "draft-suffix"), ("d", "draft_suffix")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"meta": {}, "summary": {"overall": {method: figures(1.5)}}}))
    text = compare_runs(tmp_path / "c", tmp_path / "d")
    assert "only run" not in text and "| overall | draft_suffix | 15.00 | 15.00 | +0.0% |" in text
    from specdec.bench.report import canonical_methods

    both = {"overall": {"ngram": figures(1.1), "prompt_lookup": figures(1.2)}}  # one method twice (an older file)
    assert canonical_methods(both) == both  # kept as written, not one row silently dropped


def test_every_variant_is_warmed_before_it_is_timed(tiny_target, dataset):
    """Only plain decoding was warmed: each method's first timed run paid its one-time costs (0.03-0.27 s)."""
    from specdec.sampling import SamplingParams

    calls: list[tuple[str, int]] = []  # (variant, max_tokens) in call order

    def recording(target, draft, method, config, gamma=4, tree="off"):  # noqa: ANN001, ANN202
        plain = runner.ours(target, draft, "ar", config)

        def generate_one(ids):  # noqa: ANN001, ANN202
            calls.append((f"{method}@{gamma}", config.params.max_tokens))
            return plain(ids)

        return generate_one

    rows = load_prompts(str(dataset))[:1]
    config = runner.BenchConfig(methods=["ar", "ngram", "suffix"], params=SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                                gammas=[2, 3], repeats=1)
    runner.run_benchmark(tiny_target, None, rows, config, progress=False, method_runner=recording)
    variants = {"ngram@2", "ngram@3", "suffix@2", "suffix@3"}
    first_timed = next(index for index, (_, tokens) in enumerate(calls) if tokens == 20)
    assert {name for name, tokens in calls[:first_timed] if tokens == 8} == variants  # each warmed, short, first
    assert {name for name, tokens in calls[first_timed:]} == variants and all(t == 20 for _, t in calls[first_timed:])


def test_every_method_answers_the_same_second_turn(tiny_target, dataset, monkeypatch):
    """A chat row's second turn sees plain decoding's first answer in every run: a method whose own first answer
    differed (an int8 target's rounding) was timed on another second-turn prompt than ``ar``."""
    from specdec.sampling import SamplingParams

    real_ours = runner.ours
    seen: dict[str, list[list[int]]] = {}

    def recording(target, draft, method, config, gamma=4, tree="off"):  # noqa: ANN001, ANN202
        inner = real_ours(target, draft, method, config, gamma, tree)

        def generate_one(ids):  # noqa: ANN001, ANN202
            tokens, stats, text = inner(ids)
            if config.params.max_tokens == 12:  # timed runs only (warm-ups generate 8)
                seen.setdefault(method, []).append(list(ids))
            return tokens, stats, text if method == "ar" else "a different first answer"

        return generate_one

    monkeypatch.setattr(runner, "ours", recording)
    rows = [row for row in load_prompts(str(dataset)) if len(row.turns) == 2]
    config = runner.BenchConfig(methods=["ar", "ngram"], params=SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                                gammas=[2], repeats=1)
    results = runner.run_benchmark(tiny_target, None, rows, config, progress=False)
    assert seen["ar"] == seen["ngram"] and len(seen["ar"]) == 2
    assert not any(r.mismatch for r in results)


def test_methods_naming_nothing_is_refused(capsys):
    """``--methods ""`` benched plain decoding alone and exited 0; tune refused the same."""
    assert main(["bench", "--methods", " , "]) == 1
    assert "--methods ' , ': names no method" in capsys.readouterr().err


def test_rows_longer_than_the_context_are_skipped_by_name_before_loading(tiny_dirs, dataset, tmp_path, capsys, monkeypatch):
    """A row past the model's context ended bench, tune and verify after their first measurements, unnamed (verify
    printed it as a failed losslessness check): now each such row is a warning line and the rest are measured."""
    long_rows = tmp_path / "long.jsonl"
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    rows.insert(1, {"id": "huge", "category": "code", "prompt": "x = 1\n" * 2000, "chat": False})  # > 512 tokens
    long_rows.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    common = ["--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none", "--max-tokens", "6"]
    assert main(["bench", "--dataset", str(long_rows), *common, "--methods", "ar,ngram", "--ignore-eos", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"warning: skipped {long_rows} row huge: prompt (" in err and "context window of 512 tokens" in err
    assert {r["prompt_id"] for r in json.loads((out / "results.json").read_text())["requests"]} == {"a", "b", "c"}
    assert main(["verify", "--dataset", str(long_rows), *common, "--skip-distribution", "--methods", "ngram"]) == 0
    captured = capsys.readouterr()
    assert "skipped" in captured.err and "3/3 prompts identical" in captured.out and "FAIL" not in captured.out
    assert main(["verify", "--dataset", str(long_rows), *common, "--skip-distribution", "--methods", "ngram",
                 "--prompts", "1"]) == 0  # the long row comes after the one wanted: not tokenized, not warned about
    captured = capsys.readouterr()
    assert "skipped" not in captured.err and "1/1 prompts identical" in captured.out


def test_a_chat_rows_later_turn_carries_the_earlier_ones_and_a_short_context_is_not_taken_for_32k(tiny_dirs):
    """A row under 8 KB was never tokenized (the built-in models' 32k context was assumed: the tiny model's is 512),
    and only the first turn was counted (a chat row's second turn carries the first and its answer)."""
    from specdec.bench.datasets import PromptRow
    from specdec.cli.generate import fitting_rows

    rows = [PromptRow("short", "c", ["hi"]), PromptRow("second-turn", "c", ["hi", "x = 1\n" * 200]),
            PromptRow("7kb", "c", ["x = 1\n" * 1200], chat=False), PromptRow("answers", "c", ["a", "b", "c"])]
    kept = fitting_rows(rows, str(tiny_dirs["target"]), 200, False, "rows.jsonl")
    assert [row.id for row in kept] == ["short"]  # 3 turns: two earlier answers of 200 + 200 > 512


def test_a_pinned_mode_says_what_plain_decoding_the_speedups_are_against(tiny_dirs, dataset, tmp_path, capsys):
    """A tune.json pins --quantize: bench's ar then runs in that mode, and its speedups differed from tune's chosen
    line (against auto's plain mode) with no word why."""
    assert main(["bench", "--dataset", str(dataset), "--model", str(tiny_dirs["target"]), "--methods", "ar,ngram",
                 "--quantize", "int8", "--max-tokens", "4", "--ignore-eos", "--out", str(tmp_path / "out")]) == 0
    assert "note: ar (plain decoding) runs in int8, as --quantize pins it" in capsys.readouterr().err


def test_decode_speedup_compares_the_same_requests_totals():
    """The decode column is decoded tokens over decode time summed over the same requests, per repeat (as the
    end-to-end column is): a ratio of the two methods' median time per token paired different prompts — a
    walkthrough's ngram read 1.08x decode where its decoding took longer in total."""
    def result(method: str, prompt: str, tokens: int, decode_s: float) -> runner.RequestResult:
        return runner.RequestResult(prompt, "chat", method, 0, 0, list(range(tokens)),
                                    {"tpot_s": decode_s / (tokens - 1)}, wall_s=decode_s + 0.1)

    # plain: a fast prompt (short answer) and a slow one; the method: faster on the short answer, slower on the long
    results = [result("ar", "a", 11, 0.50), result("ar", "b", 41, 2.20), result("ngram", "a", 11, 0.40),
               result("ngram", "b", 41, 2.40)]
    decode = runner.summarize(results)["overall"]["ngram"]["decode_speedup"]
    assert decode == pytest.approx(2.70 / 2.80, rel=1e-6)  # the medians of seconds per token said 1.05x


def test_misspelt_prompt_row_fields_are_named(tmp_path, caplog):
    """"chta" and "categroy" were ignored: the prompts were measured through the chat template, under "default"."""
    path = tmp_path / "typo.jsonl"
    path.write_text('{"prompt": "def f(x):", "chta": false, "categroy": "code"}\n{"prompt": "hi", "id": "b", "chat": true}\n')
    with caplog.at_level("WARNING", logger="specdec.bench.datasets"):
        rows = load_prompts(str(path))
    assert [r.chat for r in rows] == [True, True] and "fields not read: " in caplog.text
    assert "'categroy' (line 1)" in caplog.text and "'chta' (line 1)" in caplog.text
    caplog.clear()
    path.write_text('{"prompt": "a", "id": "x", "category": "c", "chat": false, "turns": ["t"]}\n')  # every field read
    with caplog.at_level("WARNING", logger="specdec.bench.datasets"):
        load_prompts(str(path))
    assert "fields not read" not in caplog.text


def test_bad_bench_inputs_leave_no_output_folder(tiny_dirs, dataset, tmp_path, capsys):
    """Every input error left an empty --out folder behind (it was made before the dataset and flags were read)."""
    for extra in (["--dataset", str(tmp_path / "missing.jsonl")], ["--dataset", str(dataset), "--gammas", "0,3"],
                  ["--dataset", str(dataset), "--methods", "ar,nonsense"]):
        out = tmp_path / "out"
        assert main(["bench", "--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none",
                     "--out", str(out), *extra]) != 0
        assert not out.exists(), extra
        assert "error" in capsys.readouterr().err
