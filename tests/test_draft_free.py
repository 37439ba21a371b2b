"""Prompt lookup (n-gram) and suffix drafting: exact through the shared verifier, correct indexes."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from specdec.errors import SpecdecError

import specdec
from specdec.config import SpecConfig
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.drafters.suffix import FrequencyTable, GlobalSuffixCache, SuffixDrafter
from specdec.sampling import SamplingParams

PROMPTS = [
    "def fibonacci(n):",  # little repetition
    "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor i in range(10):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
]


@pytest.mark.parametrize("method", ["ngram", "suffix"])
@pytest.mark.parametrize("gamma", [2, 5, "auto"])
def test_greedy_identity(tiny_target, method, gamma):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS:
        plain = specdec.generate(tiny_target, prompt, params)
        spec = specdec.generate(tiny_target, prompt, params, spec=SpecConfig(method=method, num_speculative_tokens=gamma))
        assert spec.token_ids == plain.token_ids, (method, prompt)


def test_ngram_drafts_on_repetitive_prompts(tiny_target):
    """The tiny random model repeats itself under greedy, so lookup finds matches and saves forwards."""
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    spec = specdec.generate(tiny_target, PROMPTS[2], params, spec=SpecConfig(method="ngram", num_speculative_tokens=4))
    plain = specdec.generate(tiny_target, PROMPTS[2], params)
    assert spec.stats.proposed_tokens > 0
    assert spec.token_ids == plain.token_ids
    assert spec.stats.target_forwards <= plain.stats.target_forwards


def brute_force_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) < n:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # most recent earlier occurrence with a continuation
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@pytest.mark.parametrize("seed", range(5))
def test_prompt_lookup_index_equals_brute_force(seed):
    rng = random.Random(seed)
    stream = [rng.randrange(6) for _ in range(300)]
    drafter = PromptLookupDrafter(min_n=1, max_n=3)
    drafter.start(stream[:20])
    for end in range(20, 300, 7):  # grow the context in uneven steps, as committed tokens arrive
        got = drafter.propose(stream[:end], 5).tokens
        assert got == brute_force_lookup(stream[:end], 5, 1, 3), end


class CountingIndex(dict):
    """The n-gram index, counting its reads and writes."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.reads = self.writes = 0

    def get(self, key, default=None):  # noqa: ANN001
        self.reads += 1
        return super().get(key, default)

    def __getitem__(self, key):  # noqa: ANN001
        self.reads += 1
        return super().__getitem__(key)

    def __setitem__(self, key, value) -> None:  # noqa: ANN001
        self.writes += 1
        super().__setitem__(key, value)


def lookup_work(context_len: int, seed: int = 0) -> dict[str, int]:
    """Index reads and writes and tokens indexed by 100 proposals over an unchanged context, then by
    one proposal after a committed token arrives (the decode loop's two cases)."""
    rng = random.Random(seed)
    stream = [rng.randrange(5000) for _ in range(context_len + 1)]
    drafter = PromptLookupDrafter(1, 4)
    drafter.start(stream[:-1])
    drafter.index = index = CountingIndex(drafter.index)
    indexed = []
    extend = drafter._extend
    drafter._extend = lambda new: (indexed.append(len(new)), extend(new))[1]
    for _ in range(100):
        assert drafter.propose(stream[:-1], 5).tokens == brute_force_lookup(stream[:-1], 5, 1, 4)
    work = {"reads": index.reads, "writes": index.writes, "indexed": sum(indexed)}
    index.reads = index.writes = 0
    indexed.clear()
    drafter.propose(stream, 5)
    return work | {"next_reads": index.reads, "next_writes": index.writes, "next_indexed": sum(indexed)}


def test_prompt_lookup_cost_does_not_grow_with_the_context():
    """Proposing reads the index at most once per n-gram length and never rescans the context; a new
    token adds one entry per n-gram length — the same work at 64 tokens of context as at 8k."""
    short, long = lookup_work(64), lookup_work(8192)
    assert long == short
    assert long["reads"] <= 100 * 4 and long["writes"] == long["indexed"] == 0
    assert long["next_reads"] <= 4 and long["next_writes"] <= 4 and long["next_indexed"] == 1


def test_frequency_table_prediction_and_removal():
    table = FrequencyTable(max_depth=3)
    table.add([1, 2, 3, 1, 2, 3, 1, 2, 4])
    ranked, depth = table.predict([9, 1, 2], choices=3)
    assert depth == 2 and [token for token, _ in ranked] == [3, 4]
    assert [share for _, share in ranked] == pytest.approx([2 / 3, 1 / 3])
    table.add([1, 2, 3, 1, 2, 3, 1, 2, 4], sign=-1)
    assert table.table == {} and table.entries == 0


def test_suffix_draft_length_follows_match_length_and_learned_acceptance():
    """A one-token match is right about a third of the time: a short, low-confidence draft; a long
    match drafts the whole γ; once one-token matches keep failing they stop being drafted."""
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 50, 7]  # ends in a 1-token match of "7"
    drafter = SuffixDrafter(GlobalSuffixCache())
    drafter.start(prompt)
    draft = drafter.propose(prompt, 6)
    assert draft.tokens == [8, 9] and drafter.proposed_depths == [1, 2]
    assert draft.prefix_accept == pytest.approx([0.3, 0.15])
    for _ in range(20):  # the one-token draft is rejected over and over
        drafter.accepted(0, 99)
        drafter.propose(prompt, 6)
    assert drafter.propose(prompt, 6).tokens == []
    long_match = prompt + [8, 9, 10]  # "7 8 9 10" repeats: a 4-token match that grows as it walks
    assert drafter.propose(long_match, 6).tokens == [11, 12, 50, 7, 8, 9]  # other lengths unaffected
    assert drafter.proposed_depths == [4, 5, 6, 7, 8, 8]
    before = (drafter.match_accepts[5], drafter.match_trials[5])  # match length 6: the third token
    drafter.accepted(2, 50)  # the engine cut the draft after 2 tokens; the target's next one equals the third
    assert (drafter.match_accepts[5], drafter.match_trials[5]) == (before[0] + 1, before[1] + 1)


def test_verify_costs_keep_the_draft_length_worth_its_cost():
    from specdec.adaptive import VerifyCosts

    costs = VerifyCosts()
    assert costs.best_length([0.9, 0.5, 0.1]) == 3  # nothing measured: flat, verify everything
    for k, seconds in {0: 1.0, 1: 1.2, 2: 1.4, 3: 2.0}.items():
        costs.update(k, seconds)
    assert costs.best_length([0.9, 0.5, 0.1]) == 2  # the third token would cost more than it brings
    assert costs.best_length([0.1]) == 0


def test_suffix_cache_evicts_under_cap():
    cache = GlobalSuffixCache(max_depth=4, max_cache_entries=500)
    rng = random.Random(1)
    for _ in range(50):
        cache.add_request([rng.randrange(100) for _ in range(60)])
        assert cache.table.entries <= 500
    assert len(cache.requests) < 50  # older requests were evicted


def test_shared_suffix_cache_is_per_vocabulary(tiny_target):
    """Regression (CI): a cache filled by a model with a larger vocabulary proposed ids the next
    model's embedding could not index. Caches are keyed by vocabulary; the engine also clips."""
    from types import SimpleNamespace

    from specdec.config import SpecConfig
    from specdec.drafters.base import DrafterResources
    from specdec.drafters.suffix import make_suffix_drafter
    from specdec.sampling import SamplingParams, make_generator

    def cache_of(backend, tokenizer=None):  # noqa: ANN001, ANN202
        resources = DrafterResources(target_backend=backend, spec=SpecConfig(method="suffix"), params=SamplingParams(),
                                     generator=make_generator(0), max_seq_len=64, tokenizer=tokenizer)
        return make_suffix_drafter(resources).cache

    small = SimpleNamespace(config=SimpleNamespace(vocab_size=8), step_seconds=None)  # a Backend's fields the drafter reads
    large = SimpleNamespace(config=SimpleNamespace(vocab_size=50_000), step_seconds=None)
    assert cache_of(small) is cache_of(small)
    assert cache_of(small) is not cache_of(large)
    assert cache_of(small, tiny_target.tokenizer) is not cache_of(small)


def test_engine_clips_out_of_vocabulary_drafts(tiny_target):
    from specdec.drafters.base import Draft, Drafter

    class Rogue(Drafter):
        name = "rogue"

        def propose(self, context_ids, k):
            return Draft(tokens=[1, 10**6, 2][:k] + [3] * 10)  # too long and out of vocabulary



    assert Draft([1, 2, 10**6, 3]).clipped(10, 100).tokens == [1, 2]
    assert Draft([1, 2, 3]).clipped(2, 100).tokens == [1, 2]
    from specdec.api import encode_prompt
    from specdec.engine import generate_ids
    from specdec.sampling import make_generator

    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    ids = encode_prompt(tiny_target, PROMPTS[0])
    spec = SpecConfig(method="ngram", num_speculative_tokens=4)
    out = generate_ids(tiny_target.backend, ids, params, Rogue(), spec, tiny_target.tokenizer, make_generator(0))
    assert out.token_ids == specdec.generate(tiny_target, PROMPTS[0], params).token_ids


def test_second_identical_request_is_drafted_with_high_acceptance(tiny_target):
    cache = GlobalSuffixCache()
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    from specdec.api import encode_prompt
    from specdec.engine import generate_ids
    from specdec.sampling import make_generator

    ids = encode_prompt(tiny_target, PROMPTS[0])
    spec = SpecConfig(method="suffix", num_speculative_tokens=6)
    first = generate_ids(tiny_target.backend, ids, params, SuffixDrafter(cache), spec, tiny_target.tokenizer, make_generator(0))
    second = generate_ids(tiny_target.backend, ids, params, SuffixDrafter(cache), spec, tiny_target.tokenizer, make_generator(0))
    assert second.token_ids == first.token_ids
    assert second.stats.acceptance_rate > 0.8
    assert second.stats.target_forwards < first.stats.target_forwards / 2


def test_datastore_build_load_propose_round_trip(tiny_target, tiny_dirs, tmp_path):
    from specdec.cli import main
    from specdec.drafters.retrieval import Datastore, RetrievalDrafter

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "def fibonacci(n):\\n    return n"}\n{"text": "for i in range(10):\\n    print(i)"}\n')
    out = tmp_path / "store"
    assert main(["datastore", "build", "--tokenizer", str(tiny_dirs["target"]), "--input", str(corpus), "--output", str(out)]) == 0
    store = Datastore(out)
    store.check_tokenizer(tiny_target.tokenizer)
    ids = tiny_target.tokenizer.encode("for i in range(10):\n    print(i)", add_special_tokens=False)
    drafter = RetrievalDrafter(store, min_match=2)
    assert drafter.propose(ids[:4], 5).tokens == ids[4:9]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    spec = SpecConfig(method="retrieval", num_speculative_tokens=4, datastore=str(out))
    plain = specdec.generate(tiny_target, "for i in range(10):\n", params)
    assert specdec.generate(tiny_target, "for i in range(10):\n", params, spec=spec).token_ids == plain.token_ids


def test_datastore_from_another_tokenizer_is_refused(tiny_target, tmp_path):
    from specdec.drafters.retrieval import write_datastore
    from specdec.errors import SpecdecError

    write_datastore([1, 2, 3, -1], tmp_path, fingerprint="someone-else", vocab_size=10)
    spec = SpecConfig(method="retrieval", datastore=str(tmp_path))
    with pytest.raises(SpecdecError, match="different tokenizer"):
        specdec.generate(tiny_target, "hi", SamplingParams(max_tokens=3), spec=spec)


def test_datastore_bad_inputs_are_clear(tmp_path, capsys):
    from specdec.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    assert main(["datastore", "build", "--input", str(bad), "--output", str(tmp_path / "o"), "--tokenizer", str(tmp_path / "none.gguf")]) == 1
    assert main(["generate", "hi", "--method", "retrieval", "--datastore", str(tmp_path / "missing"), "--model", str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err
    assert "no such file" in err


def test_empty_documents_are_not_indexed(tiny_dirs, tiny_target, tmp_path, capsys):
    """An empty .txt was "1 documents, 1 tokens" (its separator counted as a token); now it is no document."""
    from specdec.cli import main

    empty, text = tmp_path / "empty.txt", tmp_path / "a.txt"
    empty.write_text("")
    text.write_text("def f(x):\n    return x\n")
    base = ["datastore", "build", "--tokenizer", str(tiny_dirs["target"]), "--output", str(tmp_path / "store")]
    assert main([*base, "--input", str(empty)]) == 1
    assert "the corpus is empty" in capsys.readouterr().err
    assert main([*base, "--input", str(empty), str(text)]) == 0
    tokens = len(tiny_target.tokenizer.encode(text.read_text(), add_special_tokens=False))  # no separator counted
    assert f": 1 document, {tokens} tokens" in capsys.readouterr().err


def test_binary_files_and_empty_rows_are_skipped_and_said_and_missing_files_found_first(tiny_dirs, tmp_path, capsys):
    """A walkthrough: /bin/ls was indexed (118k tokens of replacement characters), random bytes as .jsonl ended in a
    UnicodeDecodeError traceback, one {"text": ""} row (an empty __init__.py) stopped a whole build, and a missing
    file was found only after the files before it were tokenized."""
    from specdec.cli import main
    from specdec.cli.datastore import read_corpus
    from specdec.errors import SpecdecError

    binary, rows, text = tmp_path / "ls.txt", tmp_path / "rows.jsonl", tmp_path / "a.txt"
    binary.write_bytes(b"\x7fELF\x02\x01\x00\x00" + bytes(range(256)))
    rows.write_text('{"text": ""}\n{"text": "def g():\\n    pass\\n"}\n')
    text.write_text("def f(x):\n    return x\n")
    base = ["datastore", "build", "--tokenizer", str(tiny_dirs["target"]), "--output", str(tmp_path / "store")]
    assert main([*base, "--input", str(binary), str(rows), str(text)]) == 0
    assert ": 2 documents," in (err := capsys.readouterr().err) and "(skipped 1 binary file, 1 empty document)" in err
    garbage = tmp_path / "random.jsonl"
    garbage.write_bytes(b'{"text": "x"}\n\xf2\x80\x00\xff\n')
    with pytest.raises(SpecdecError, match=r"random.jsonl:2: not UTF-8 text"):
        list(read_corpus([str(garbage)]))
    with pytest.raises(SpecdecError, match="corpus file not found"):
        next(read_corpus([str(text), str(tmp_path / "missing.txt")]))  # before the first document


def test_a_corrupt_datastore_is_one_clear_error(tiny_dirs, tiny_target, tmp_path):
    """An emptied suffix array (EOFError) and a meta.json of {} (KeyError) ended in tracebacks; a suffix array of
    the wrong length was taken silently; a path to meta.json itself was "not a datastore (no meta.json)"."""
    import shutil

    from specdec.cli.datastore import read_corpus
    from specdec.drafters.retrieval import Datastore, build_datastore
    from specdec.errors import SpecdecError

    text = tmp_path / "a.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 4)
    good = tmp_path / "good"
    build_datastore(tiny_target.tokenizer, read_corpus([str(text)]), good)
    Datastore(good)
    damages = {"meta.json": lambda p: p.write_text("{}"), "suffix_array.npy": lambda p: p.write_bytes(b""),
               "tokens.npy": lambda p: np.save(p, np.zeros(3, dtype=np.int32))}
    for name, damage in damages.items():
        broken = tmp_path / f"broken-{name}"
        shutil.copytree(good, broken)
        damage(broken / name)
        with pytest.raises(SpecdecError, match="is corrupt"):
            Datastore(broken)
    with pytest.raises(SpecdecError, match="is a file: give the datastore's folder"):
        Datastore(good / "meta.json")


def test_malformed_corpus_line_names_file_and_line(tmp_path):
    from specdec.cli.datastore import read_corpus
    from specdec.errors import SpecdecError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(SpecdecError, match=r"bad.jsonl:2: malformed JSON"):
        list(read_corpus([str(bad)]))


def test_datastore_and_train_drafter_read_the_same_jsonl_fields_and_dataset_names(tmp_path):
    """One reader for both corpora: each row's text, a prompt with its answer (a completion, HumanEval's
    canonical solution, GSM8K's question and answer) or chat turns; named datasets as bench reads them
    (train-drafter refused `gsm8k` as a missing file and ignored canonical_solution; datastore ignored
    completions)."""
    from specdec.bench.datasets import dataset_path, read_jsonl
    from specdec.cli.datastore import read_corpus
    from specdec.errors import SpecdecError
    from specdec.train.data import load_documents

    rows = [{"text": "t"}, {"prompt": "p", "completion": "c"}, {"prompt": "def f():", "canonical_solution": " pass"},
            {"question": "q?", "answer": "a"}, {"turns": ["one", "two"]}]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    expected = ["t", "pc", "def f(): pass", "q?a", "one\ntwo"]
    assert list(read_corpus([str(corpus)])) == expected
    assert [doc.text for doc in load_documents(str(corpus))] == expected

    gsm8k = read_jsonl(dataset_path("gsm8k"))
    documents = load_documents("gsm8k")
    assert len(documents) == len(gsm8k) and documents[0].text == gsm8k[0]["question"] + gsm8k[0]["answer"]
    assert next(read_corpus(["humaneval"])).startswith(read_jsonl(dataset_path("humaneval"))[0]["prompt"])

    corpus.write_text('{"id": 1}\n')
    for read in (lambda: list(read_corpus([str(corpus)])), lambda: load_documents(str(corpus))):
        with pytest.raises(SpecdecError, match=r"corpus.jsonl:1: .*'question' \(\+ 'answer'\)"):
            read()


def test_a_json_array_corpus_is_read_as_rows_not_as_raw_text(tmp_path):
    """A .json corpus (ShareGPT-style sets ship as one array) was indexed and trained on as raw text,
    brackets and keys included: its rows are read as a .jsonl file's, ShareGPT 'conversations' and
    OpenAI 'messages' included; anything else in a .json file is a clear error."""
    from specdec.cli.datastore import read_corpus
    from specdec.errors import SpecdecError
    from specdec.train.data import load_documents

    rows = [{"text": "t"}, {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    corpus = tmp_path / "share.json"
    corpus.write_text(json.dumps(rows, indent=1))
    expected = ["t", "hi\nhello", "q\na"]
    assert list(read_corpus([str(corpus)])) == expected
    assert [doc.text for doc in load_documents(str(corpus))] == expected
    corpus.write_text('{"text": "one object"}')
    for read in (lambda: list(read_corpus([str(corpus)])), lambda: load_documents(str(corpus))):
        with pytest.raises(SpecdecError, match=r"share.json: a .json file must hold one array of objects"):
            read()
    corpus.write_text('[{"text": 1,}]')
    with pytest.raises(SpecdecError, match=r"share.json: malformed JSON at line 1"):
        list(read_corpus([str(corpus)]))


def test_a_datastore_window_past_the_limit_is_refused(tmp_path):
    """--window 100000000 sorted tokens × window keys: 23 GB and the machine's OOM killer."""
    from specdec.drafters.retrieval import MAX_WINDOW, write_datastore

    with pytest.raises(SpecdecError, match=f"window must be 1..{MAX_WINDOW} tokens"):
        write_datastore([5, 6, 7], tmp_path / "ds", "fingerprint", 100, window=10**8)
    assert not (tmp_path / "ds").exists()
