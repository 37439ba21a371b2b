"""The offline batch API (issue 24, part 4): specdec.generate_batch runs many prompts through the
same continuous batching as the server — each answer equal to generating that prompt alone — and
`specdec bench --concurrency N` reports the throughput."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
import torch

import specdec
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams

PROMPTS = [f"def f{i}(x):" for i in range(7)] + ["The quick brown fox", "a a a a a a"]


class FakeModel:
    """A model for the scheduler tests: records each forward's rows per call, returns zero logits."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def forward_batch(self, calls, vocab_limit=None):
        self.batches.append([len(tokens) for _, tokens, _, _ in calls])
        return [torch.zeros(len(tokens), 4) for _, tokens, _, _ in calls]


@pytest.fixture(scope="module")
def int8_pair(tiny_dirs, int4_kernel):
    target = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int8")
    draft = specdec.load_model(tiny_dirs["draft"], dtype="float32", device="cpu", quantize="int8")
    return target, draft


@pytest.mark.parametrize("spec", [None, specdec.SpecConfig(method="draft_model", num_speculative_tokens=3),
                                  specdec.SpecConfig(method="suffix", num_speculative_tokens=4, spec_tree="auto"),
                                  specdec.SpecConfig(method="draft_model", num_speculative_tokens=3, spec_tree=6)],
                         ids=["default", "draft_model", "suffix-tree", "draft-tree"])
def test_batch_answers_equal_each_prompt_alone_and_share_forwards(int8_pair, spec):
    target, draft = int8_pair
    params = [SamplingParams(temperature=0, max_tokens=12 + i, ignore_eos=True) for i in range(len(PROMPTS))]
    calls: dict[str, list[int]] = {"target": [], "draft": []}
    for role, model in (("target", target), ("draft", draft)):
        def spy(batch, vocab_limit=None, role=role, forward_batch=model.backend.forward_batch):
            calls[role].append(len(batch))
            return forward_batch(batch, vocab_limit=vocab_limit)

        model.backend.forward_batch = spy
    try:
        outs = specdec.generate_batch(target, PROMPTS, params, draft=draft, spec=spec, max_num_seqs=4,
                                      disable_speculation_above="never")  # drafting at any load: its batching is tested
    finally:
        del target.backend.forward_batch, draft.backend.forward_batch
    alone = [specdec.generate(target, p, q, draft=draft, spec=spec) for p, q in zip(PROMPTS, params)]
    assert [o.token_ids for o in outs] == [a.token_ids for a in alone]
    assert [o.text for o in outs] == [a.text for a in alone]
    assert max(calls["target"]) == 4 and len(calls["target"]) < sum(o.stats.target_forwards + 1 for o in outs)  # shared
    if spec is None:  # the defaults: draft_suffix at γ=auto, which may find that the tiny draft does not pay
        assert not calls["draft"] or max(calls["draft"]) <= 4
    elif spec.method == "draft_model":  # its steps and trees batched too
        assert max(calls["draft"]) == 4 and len(calls["draft"]) < sum(o.stats.draft_forwards for o in outs)
    else:
        assert calls["draft"] == []


@pytest.mark.parametrize("spec", [None, specdec.SpecConfig(method="draft_model", num_speculative_tokens=3),
                                  specdec.SpecConfig(method="draft_model", num_speculative_tokens=3, draft_vocab_size=300)],
                         ids=["plain", "draft_model", "draft-vocab"])
def test_sampled_batch_is_reproducible_per_seed(int8_pair, spec):
    """A seeded request's text is plain decoding's with its seed, batched or alone, speculating or not,
    whatever the load lets it draft (specdec.seeded); and batched draft steps give each request the
    draft distribution q it gets alone (row-wise kernels), so with no load limit it drafts the same."""
    target, draft = int8_pair
    draft = draft if spec is not None else None
    params = SamplingParams(temperature=0.8, max_tokens=10, seed=3, ignore_eos=True)
    plain = [specdec.generate(target, p, params).token_ids for p in PROMPTS[:4]]
    alone = [specdec.generate(target, p, params, draft=draft, spec=spec) for p in PROMPTS[:4]]
    for limit, pause in (("auto", True), ("never", False)):  # auto: 4 requests share forwards, the policy may stop drafting
        outs = specdec.generate_batch(target, PROMPTS[:4], params, draft=draft, spec=spec, max_num_seqs=4,
                                      disable_speculation_above=limit, pause_speculation_for_prompts=pause)
        assert [o.token_ids for o in outs] == [a.token_ids for a in alone] == plain
    if spec is not None:
        assert [o.stats.proposed_tokens for o in outs] == [a.stats.proposed_tokens for a in alone]
        assert all(a.stats.proposed_tokens > 0 for a in alone)


def test_the_traffic_alpha_is_learned_from_rounds_while_the_first_wave_runs(int8_pair, monkeypatch):
    """A fresh server's first wave of concurrent requests drafted at the prior's γ to its end when α was
    learned from finished requests only (0.94x off at 8 chat requests, session 50): every round reaches
    the policy as its chunk is delivered, each exactly once, before any request of the wave finishes."""
    from specdec.policy import BatchPolicy

    target, draft = int8_pair
    events: list[tuple[str, object]] = []
    observe_rounds, observe_finished = BatchPolicy.observe_rounds, BatchPolicy.observe_finished
    monkeypatch.setattr(BatchPolicy, "observe_rounds",
                        lambda self, rounds: (events.append(("rounds", list(rounds))), observe_rounds(self, rounds)))
    monkeypatch.setattr(BatchPolicy, "observe_finished",
                        lambda self, stats: (events.append(("finished", stats)), observe_finished(self, stats)))
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = specdec.generate_batch(target, PROMPTS[:4], params, draft=draft, spec=spec, max_num_seqs=4,
                                  disable_speculation_above="never")
    first_finished = next(i for i, (kind, _) in enumerate(events) if kind == "finished")
    seen_before = {id(r) for kind, rounds in events[:first_finished] if kind == "rounds" for r in rounds}  # type: ignore[union-attr]
    for out in outs:  # every request drafted and was judged, mid-wave (how many rounds each got in is timing)
        judged = [r for r in out.stats.rounds if id(r) in seen_before]
        assert judged and sum(r.chain_trials()[1] for r in judged) >= 1
    seen = [id(r) for kind, rounds in events if kind == "rounds" for r in rounds]  # type: ignore[union-attr]
    assert sorted(seen) == sorted(id(r) for o in outs for r in o.stats.rounds)  # each round once
    assert sum(kind == "finished" for kind, _ in events) == 4


def test_waiting_for_other_requests_is_not_charged_to_a_round():
    """``calls.waited``: time suspended beyond the forward time a call was charged (its share of a
    batched forward) is reported apart, so the γ controller weighs this request's own costs."""
    import time

    from specdec.calls import ModelCall, waited

    def steps():
        first = yield ModelCall(None, None, [1])
        second = yield ModelCall(None, None, [2, 3])
        return first + second

    driven = waited(steps())
    call = next(driven)
    try:
        while True:
            time.sleep(0.05)  # other requests' forwards
            call.seconds = 0.01  # this call's share
            call = driven.send(len(call.tokens))
    except StopIteration as stop:
        value, idle = stop.value
    assert value == 3
    assert 0.07 <= idle < 0.2


def test_batch_errors_are_clear(int8_pair):
    target, _ = int8_pair
    with pytest.raises(SpecdecError, match="SamplingParams"):
        specdec.generate_batch(target, PROMPTS[:3], [SamplingParams()] * 2)
    with pytest.raises(SpecdecError, match="token ids"):
        specdec.generate_batch(target, ["ok", [10_000_000]])
    with pytest.raises(SpecdecError, match="context window"):
        specdec.generate_batch(target, ["ok", "x " * 200], SamplingParams(max_tokens=64 * 1024))
    for seqs in (0, "8", 2.5, True):  # "8" was a TypeError from the scheduler's loop, 2.5 ran
        with pytest.raises(SpecdecError, match="max_num_seqs must be an integer >= 1"):
            specdec.generate_batch(target, ["ok"], max_num_seqs=seqs)
    with pytest.raises(SpecdecError, match="max_num_batched_tokens must be an integer >= 1"):
        specdec.generate_batch(target, ["ok"], max_num_batched_tokens="4096")
    import numpy as np

    assert specdec.generate_batch(target, ["ok"], SamplingParams(max_tokens=2), max_num_seqs=np.int64(2))[0].token_ids
    for setting in ("sometimes", -1):
        with pytest.raises(SpecdecError, match="disable_speculation_above"):
            specdec.generate_batch(target, ["ok"], disable_speculation_above=setting)


def test_bench_concurrency_reports_throughput(tiny_dirs, tmp_path, capsys, int4_kernel):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:6]))
    out = tmp_path / "bench"
    code = main(["bench", "--dataset", str(data), "--model", str(tiny_dirs["target"]), "--methods", "ar,ngram,suffix",
                 "--concurrency", "4", "--repeats", "1", "--max-tokens", "10", "--quantize", "int8", "--ignore-eos",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    overall = json.loads((out / "results.json").read_text())["summary"]["overall"]
    assert set(overall) == {"ar", "ngram", "suffix"} and all(m["mismatches"] == 0 for m in overall.values())
    assert overall["ar"]["requests"] == 6 and overall["ar"]["tokens_per_s"] > 0
    assert "4 requests in flight" in (out / "report.md").read_text()
    # --disable-speculation-above: never = every request drafts at its own γ; 0 = none drafts
    for limit, drafts in (("never", True), ("0", False)):
        code = main(["bench", "--dataset", str(data), "--model", str(tiny_dirs["target"]), "--methods", "suffix",
                     "--concurrency", "4", "--repeats", "1", "--max-tokens", "10", "--quantize", "int8", "--ignore-eos",
                     "--disable-speculation-above", limit, "--out", str(out)])
        assert code == 0, capsys.readouterr().err
        results = json.loads((out / "results.json").read_text())
        assert results["summary"]["overall"]["suffix"]["mismatches"] == 0
        drafted = any(r["stats"].get("proposed_tokens") for r in results["requests"] if r["method"] == "suffix")
        assert drafted == drafts, limit


@contextlib.contextmanager
def forward_rows(model):  # noqa: ANN001, ANN201 - a LoadedModel; yields the list it fills
    """The rows of every batched forward of ``model`` while the block runs."""
    sizes: list[int] = []
    forward_batch = model.backend.forward_batch
    model.backend.forward_batch = lambda batch, vocab_limit=None: (sizes.append(sum(len(c[1]) for c in batch)),
                                                                  forward_batch(batch, vocab_limit=vocab_limit))[1]
    try:
        yield sizes
    finally:
        del model.backend.forward_batch


def test_chunked_prefill_is_bit_identical_and_shares_forwards(int8_pair):
    """A prompt fed 4 tokens per call (chunked prefill) gives the answer of one whole-prompt pass —
    the int8 layers are row by row — while its chunks ride in the same forwards as the others."""
    target, draft = int8_pair
    assert specdec.chunking.default_prefill_chunk(target.backend) == specdec.chunking.PREFILL_CHUNK
    long_prompts = [" ".join(f"word{j}" for j in range(i, i + 12)) for i in range(5)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3, spec_tree=4)
    with forward_rows(target) as sizes:
        outs = specdec.generate_batch(target, long_prompts, params, draft=draft, spec=spec, max_num_seqs=5, prefill_chunk=4)
    assert [o.token_ids for o in outs] == [specdec.generate(target, p, params).token_ids for p in long_prompts]
    assert max(sizes) <= 5 * 4 + 5 * 5  # no whole prompt went in one call


def test_the_batch_api_shrinks_a_long_prompts_chunks_while_others_decode(int8_pair, monkeypatch):
    """generate_batch fed every prompt in 256-token chunks: a short request's 40 tokens waited 34 s beside a 2787-token
    prompt. By default it now follows the server's rule (chunking.shared_prefill_chunk), for the whole long prompt; a
    chunk the caller gives is used as given. Answers do not change."""
    target, _ = int8_pair
    monkeypatch.setattr(specdec.chunking, "LONG_PROMPT_TOKENS", 40)  # the tiny model's context is 512
    monkeypatch.setattr(specdec.chunking, "SHARED_PREFILL_CHUNK", 4)
    prompts = ["def f(x):", " ".join(f"word{j}" for j in range(60))]
    long_tokens = len(target.tokenizer.encode(prompts[1]))
    # the short one decodes for longer than the long prompt's pass takes in 4-token calls (alone, it gets whole ones)
    params = [SamplingParams(temperature=0, max_tokens=long_tokens // 4 + 8, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)]
    with forward_rows(target) as sizes:
        outs = specdec.generate_batch(target, prompts, params, max_num_seqs=2)
    assert [o.token_ids for o in outs] == [specdec.generate(target, p, q).token_ids for p, q in zip(prompts, params)]
    assert max(sizes[1:]) <= 4 + 1 and sum(1 for rows in sizes if rows >= 4) >= long_tokens // 4  # 4 a call, to its end
    with forward_rows(target) as sizes:
        specdec.generate_batch(target, prompts, params, max_num_seqs=2, prefill_chunk=256)
    assert max(sizes) >= 256  # as given
    # two long prompts: the first arrival's pass has no company (the second waits for its end, first come, first
    # served): whole; the second's, beside the first's decode steps, in small calls. (Both went in 4-token calls.)
    both_long = [prompts[1], prompts[1].replace("word", "term")]
    params = [SamplingParams(temperature=0, max_tokens=long_tokens // 4 + 40, ignore_eos=True), params[1]]
    with forward_rows(target) as sizes:
        outs = specdec.generate_batch(target, both_long, params, max_num_seqs=2)
    assert [o.token_ids for o in outs] == [specdec.generate(target, p, q).token_ids for p, q in zip(both_long, params)]
    first_pass = [min(specdec.chunking.PREFILL_CHUNK, long_tokens - done) for done in range(0, long_tokens, specdec.chunking.PREFILL_CHUNK)]
    assert sizes[:len(first_pass)] == first_pass and max(sizes[len(first_pass):]) <= 4 + 1
    for bad in (-1, 2.5, True):
        with pytest.raises(SpecdecError, match="prefill_chunk must be an integer >= 0"):
            specdec.generate_batch(target, prompts, params, prefill_chunk=bad)


def test_a_prompt_chunks_as_the_server_says_before_each_call_and_the_logits_do_not_change(int8_pair):
    """The server shrinks a long prompt's chunks while other requests decode (each of their tokens waits for the
    forward that carries a chunk: a 16-token completion behind a 3300-token prompt took 15.9 s with 256-token chunks,
    4.9 s with 64): the engine asks before every call, and any chunking gives the whole pass's logits."""
    from specdec.engine import prompt_pass
    from specdec.server.state import ServerState

    target, _ = int8_pair
    ids = target.tokenizer.encode(" ".join(f"word{j}" for j in range(20)))
    params = SamplingParams(temperature=0, max_tokens=1)

    def run(chunk) -> tuple[torch.Tensor, list[int]]:  # noqa: ANN001 - an int or a callable
        state, sizes = target.backend.new_state(len(ids) + 4), []
        steps = prompt_pass(target.backend, state, ids, params, None, chunk)
        call = next(steps)
        while True:
            sizes.append(len(call.tokens))
            try:
                call = steps.send(target.backend.forward(state, call.tokens, num_logits=1))
            except StopIteration as done:
                return done.value[0], sizes

    whole, whole_sizes = run(0)
    asked, told = iter([8, 3, 5, 100]), []
    chunked, sizes = run(lambda remaining, total: told.append((remaining, total)) or next(asked))
    assert whole_sizes == [len(ids)] and sizes == [8, 3, 5, len(ids) - 16]
    assert told == [(len(ids), len(ids)), (len(ids) - 8, len(ids)), (len(ids) - 11, len(ids)), (len(ids) - 16, len(ids))]
    assert torch.equal(whole, chunked)

    class Executor:
        busy = False

        def others_in_flight(self) -> bool:
            return self.busy

    executor = Executor()
    state = ServerState(target=target, model_name="tiny", prefill_chunk=256, shared_prefill_chunk=64, long_prompt_tokens=1024,
                        executor=executor)
    assert state.next_prefill_chunk(3000, 3000) == 256  # alone: the efficient chunk
    executor.busy = True
    assert state.next_prefill_chunk(3000, 3000) == 64  # a long prompt, others decoding: their tokens wait for a smaller forward
    # its last 1024 tokens too (they went in 256-token calls: ~2 s between the others' tokens on a Zen 4)
    assert state.next_prefill_chunk(900, 3000) == 64
    assert state.next_prefill_chunk(1000, 1000) == 256  # a short prompt keeps whole chunks: its TTFT
    assert dataclasses.replace(state, shared_prefill_chunk=0).next_prefill_chunk(3000, 3000) == 256  # an explicit --prefill-chunk


def test_the_default_forward_holds_about_one_prompt_chunk_besides_every_verification(int8_pair):
    """max_num_batched_tokens=None: one prefill chunk plus each running request's largest
    verification (a CPU forward is compute-bound from a few dozen rows; more prompt per forward only
    delays first tokens); 2048 when prompts are not chunked. Answers are each prompt's alone."""
    from specdec.chunking import WHOLE_PROMPT_BATCH_TOKENS, default_max_num_batched_tokens

    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3)  # greedy trees: up to 2γ nodes
    assert default_max_num_batched_tokens(256, 8, spec) == 256 + 8 * 7
    chains = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3, spec_tree="off")
    assert default_max_num_batched_tokens(256, 8, chains) == 256 + 8 * 4
    assert default_max_num_batched_tokens(256, 8, specdec.SpecConfig(num_speculative_tokens="auto", spec_tree="off")) == 256 + 8 * 9
    assert default_max_num_batched_tokens(256, 8, specdec.SpecConfig(num_speculative_tokens="auto")) == 256 + 8 * 17
    assert default_max_num_batched_tokens(256, 2, specdec.SpecConfig(num_speculative_tokens=2, spec_tree=6)) == 256 + 2 * 7
    assert default_max_num_batched_tokens(0, 8, spec) == WHOLE_PROMPT_BATCH_TOKENS

    target, draft = int8_pair
    prompts = [" ".join(f"word{j}" for j in range(i, i + 16)) for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with forward_rows(target) as sizes:
        outs = specdec.generate_batch(target, prompts, params, draft=draft, spec=chains, max_num_seqs=4, prefill_chunk=8)
    assert [o.token_ids for o in outs] == [specdec.generate(target, p, params).token_ids for p in prompts]
    assert max(sizes) <= default_max_num_batched_tokens(8, 4, chains) < 4 * 8  # never all four prompts' chunks at once


def test_the_scheduler_drafts_first_so_verifications_share_a_forward():
    """Requests whose drafts are in different phases (one mid-draft, one about to verify) must still
    verify in one target forward: the batcher serves draft-model calls until everyone waits on the
    target. Served in the same step, a draft step and a verification went to separate forwards."""
    from specdec.calls import ModelCall
    from specdec.scheduler import END, Batcher, Stream

    class Model:
        def __init__(self, name):
            self.name, self.batches = name, []

        def forward_batch(self, calls, vocab_limit=None):
            self.batches.append(len(calls))
            return [torch.zeros(len(tokens), 4) for _, tokens, _, _ in calls]

    target, draft = Model("target"), Model("draft")

    def request(offset, rounds=3, gamma=3):
        for _ in range(offset):  # starts this many draft steps into its first round
            yield ModelCall(draft, None, [0], role="draft")
        for _ in range(rounds):
            yield ModelCall(target, None, [0] * (gamma + 1))
            for _ in range(gamma):
                yield ModelCall(draft, None, [0], role="draft")

    done = []
    batcher = Batcher()
    for offset in (0, 1, 2):
        batcher.add(Stream(request(offset), lambda item: done.append(item) if item is END else None, lambda: False))
    while batcher.streams:
        batcher.step()
    assert len(done) == 3
    assert target.batches == [3, 3, 3]  # every verification shared by all three
    assert max(draft.batches) == 3


def test_one_prompt_per_forward_where_prompts_are_compute_bound():
    """prompts_per_forward=1 (chunked prefill on a CPU): two prompts arriving together go to two
    forwards, oldest first — the first one's first token waits only for its own pass — while decode
    steps ride in both; None keeps packing them by rows (a GPU). Every stream finishes."""
    from specdec.chunking import prompts_per_forward
    from specdec.calls import ModelCall
    from specdec.scheduler import END, Batcher, Stream

    assert prompts_per_forward(256) == 1 and prompts_per_forward(0) is None

    def request(prompt_len, decode=3):
        yield ModelCall(target, None, [0] * prompt_len, 1, prompt=True)
        for _ in range(decode):
            yield ModelCall(target, None, [0])

    for per_forward, expected in ((1, [[1, 10], [20, 1, 1]]), (None, [[1, 10, 20]])):
        target, done = FakeModel(), []
        batcher = Batcher(prompts_per_forward=per_forward)
        batcher.add(Stream(request(5), lambda item: None, lambda: False))
        batcher.step()  # the first request's prompt alone
        for length in (10, 20):
            batcher.add(Stream(request(length), lambda item: done.append(item) if item is END else None, lambda: False))
        batcher.step()
        if per_forward == 1:
            batcher.step()
        assert target.batches[1:] == expected
        while batcher.streams:
            batcher.step()
        assert len(done) == 2


def test_chunked_prompts_are_served_first_come_first_served():
    """Three long prompts arriving together, in chunks, one prompt per forward: the first arrival's chunks run
    to its end before the second's begin. They took turns (the served stream went to the back), and all three
    first tokens came at the end: three 2k-token prompts' TTFTs 55.5, 58.0 and 58.4 s."""
    from specdec.calls import ModelCall
    from specdec.scheduler import END, Batcher, Stream

    def request(name, chunks=3, decode=2):
        for _ in range(chunks):
            yield ModelCall(target, None, [name] * (3 + name), 1, prompt=True)  # chunks of 4, 5, 6 tokens
        first_token.append(name)
        for _ in range(decode):
            yield ModelCall(target, None, [name])

    target, first_token, done = FakeModel(), [], []
    batcher = Batcher(prompts_per_forward=1)
    for name in (1, 2, 3):
        batcher.add(Stream(request(name), lambda item: done.append(item) if item is END else None, lambda: False))
    forwards = 0
    while batcher.streams:
        batcher.step()
        forwards += 1
    assert first_token == [1, 2, 3] and len(done) == 3
    # the first request's three chunks ran in the first three forwards, its first token after the third
    assert target.batches[:3] == [[4], [4], [4]]
    assert sorted(target.batches[3]) == [1, 5]  # then it decodes beside the second's first chunk


def test_the_servers_model_thread_batches_with_its_prompts_per_forward():
    """ModelExecutor.prompts_per_forward (serve's --max-num-partial-prefills) reaches the Batcher: two
    prompts that arrive together still go to separate forwards."""
    import threading

    from specdec.calls import ModelCall
    from specdec.scheduler import END
    from specdec.server.executor import ModelExecutor

    finished = threading.Semaphore(0)
    target = FakeModel()
    batches = target.batches

    def request(prompt_len):
        yield ModelCall(target, None, [0] * prompt_len, 1, prompt=True)
        yield ModelCall(target, None, [0])

    executor = ModelExecutor(name="test-model-thread")
    executor.prompts_per_forward = 1
    executor.enable_batching()
    hold = threading.Event()
    holder = threading.Thread(target=executor.call, args=(hold.wait,))
    holder.start()  # the model thread waits in this call while both requests arrive
    for length in (10, 20):
        executor.add_stream(request(length), lambda item: finished.release() if item is END else None, lambda: False)
    hold.set()
    holder.join()
    assert finished.acquire(timeout=10) and finished.acquire(timeout=10)
    assert batches[:2] == [[10], [20, 1]]


def test_a_prompt_is_pending_until_its_first_token():
    """Batcher.prompt_pending: from a stream's arrival until it delivers its first chunk (its prompt
    pass, chunked or not, has run) — what the running requests' gates ask before drafting."""
    from specdec.calls import ModelCall
    from specdec.scheduler import Batcher, Stream

    target, seen = FakeModel(), []

    def request():
        yield ModelCall(target, None, [0] * 4, 1, prompt=True)  # two chunks of prompt
        yield ModelCall(target, None, [0] * 4, 1, prompt=True)
        yield "first token"
        seen.append(batcher.prompt_pending())  # asked where a request asks its gate
        yield ModelCall(target, None, [0])

    def running():  # a request already decoding, ahead of the new one in the batcher's order
        yield "its first token"
        for _ in range(3):
            seen.append(("running asks", batcher.prompt_pending()))
            yield ModelCall(target, None, [0])

    batcher = Batcher()
    old, new = Stream(running(), lambda item: None, lambda: False), Stream(request(), lambda item: None, lambda: False)
    batcher.add(old)
    batcher.add(new)
    assert batcher.prompt_pending()
    batcher.step()
    assert new.prefilling and not old.prefilling and batcher.prompt_pending()  # one chunk done
    batcher.step()  # the second: the prompt pass has run, its first token is not out yet
    seen.clear()
    batcher.step()  # the new stream delivers its first token before the running one asks
    assert seen == [False, ("running asks", False)]
    while batcher.streams:
        batcher.step()


def test_running_requests_pause_drafting_while_a_prompt_waits_and_answers_do_not_change(int8_pair):
    """generate_batch(pause_speculation_for_prompts=True): rounds of running requests while another
    request's prompt pass waits draft nothing (more empty rounds than without the pause), and every
    answer is still the prompt's answer alone; the measured policy ("auto") keeps them too."""
    target, draft = int8_pair
    # chains: a tree round may draft nothing by itself (the cost model cut every node), which would
    # read as a paused round
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3, spec_tree="off")
    params = [SamplingParams(temperature=0, max_tokens=10 + 3 * i, ignore_eos=True) for i in range(len(PROMPTS))]
    alone = [specdec.generate(target, p, q, draft=draft, spec=spec).token_ids for p, q in zip(PROMPTS, params)]
    empty_rounds = {}
    for pause in (True, False):
        outs = specdec.generate_batch(target, PROMPTS, params, draft=draft, spec=spec, max_num_seqs=3,
                                      disable_speculation_above="never", pause_speculation_for_prompts=pause)
        assert [o.token_ids for o in outs] == alone
        # a request's last round may draft nothing by itself (one token left): not counted
        empty_rounds[pause] = sum(1 for o in outs for r in o.stats.rounds[:-1] if not r.drafted)
    assert empty_rounds[True] > empty_rounds[False] == 0
    outs = specdec.generate_batch(target, PROMPTS, params, draft=draft, spec=spec, max_num_seqs=3)
    assert [o.token_ids for o in outs] == alone


def test_a_stream_added_on_the_model_thread_joins_the_next_forward():
    """The server builds a request and adds its stream in one visit to the model thread (Job.open):
    added there, the stream is in the very next forward, beside a running request's decode step —
    not one forward later, as when it arrived through the inbox after the call returned."""
    import threading

    from specdec.calls import ModelCall
    from specdec.scheduler import END
    from specdec.server.executor import ModelExecutor

    finished = threading.Semaphore(0)
    target = FakeModel()
    batches = target.batches

    stop = threading.Event()

    def running():  # decodes until the test is done, however slowly this thread gets scheduled
        while not stop.is_set():
            yield ModelCall(target, None, [0])

    def request():
        yield ModelCall(target, None, [0] * 7, 1, prompt=True)

    executor = ModelExecutor(name="test-model-thread-join")
    executor.enable_batching()
    done = lambda item: finished.release() if item is END else None  # noqa: E731
    executor.add_stream(running(), done, lambda: False)

    def join() -> int:  # on the model thread, between two forwards: how many ran before
        executor.add_stream(request(), done, lambda: False)
        return len(batches)

    before = executor.call(join)
    assert finished.acquire(timeout=10)  # the new request
    stop.set()
    assert finished.acquire(timeout=10)
    assert sorted(batches[before]) == [1, 7]  # the very next forward carries the new prompt


def test_bad_batch_input_names_the_prompt_before_any_work(tiny_target):
    """A model name passed as the model was an AttributeError; an empty or too long prompt failed the whole batch
    without saying which."""
    from specdec.errors import ContextLengthError, SpecdecError

    params = SamplingParams(temperature=0.0, max_tokens=4)
    with pytest.raises(TypeError, match="target must be a LoadedModel"):
        specdec.generate_batch("smollm2-135m", ["hi"], params)
    with pytest.raises(SpecdecError, match="prompt 1: the prompt is empty"):
        specdec.generate_batch(tiny_target, ["hi", ""], params)
    with pytest.raises(ContextLengthError, match="prompt 2: prompt"):
        specdec.generate_batch(tiny_target, ["hi", "x", "hi " * 600], params)
    with pytest.raises(TypeError, match="params must be SamplingParams"):
        specdec.generate_batch(tiny_target, ["hi"], [{"max_tokens": 2}])
