"""A prompt twin's attention (``prompt_attention``, layer_ops.cpp / attention_amx.cpp / attention_bf16.cpp): on
a CPU with AMX-BF16 its causal rows multiply in bf16 on tiles, on one with AVX-512 BF16 with vdpbf16ps where
that measured faster — other bits than decoding's attention, which the twin may have (its rows are never
decode or verification rows) — but each row's bits must not depend on how the prompt is split into passes (a
prefix cache continues a stored prompt; the server prefills in chunks), and speculative output must stay
plain output. Elsewhere it is ``attention``, bit for bit."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.kernels import prompt_attention as choice
from specdec.sampling import SamplingParams
from tests.conftest import make_tiny_model_dir
from tests.model_fixtures import TINY_QWEN2_Q4

# (heads, kv_heads, head_dim): the 1.5B's and 0.5B's groups, no grouping at 32 wide, a head the AMX path
# leaves to the float kernels (not a multiple of 32)
SHAPES = [(12, 2, 128), (14, 2, 64), (4, 4, 32), (10, 2, 40)]


def prompt(heads: int, kv_heads: int, dim: int, tokens: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen) * 2
    angles = torch.rand(tokens, dim, generator=gen) * 6
    return qkv, angles.cos().contiguous(), angles.sin().contiguous()


def run_in_passes(fn, qkv, cos, sin, heads, kv_heads, dim, sizes, capacity):
    """``fn`` over the prompt in passes of ``sizes`` tokens (one cache): the outputs, and the cache."""
    keys, values = torch.zeros(kv_heads, capacity, dim), torch.zeros(kv_heads, capacity, dim)
    outs, first = [], 0
    for size in sizes:
        rows = slice(first, first + size)
        outs.append(fn(qkv[rows].contiguous(), cos[rows].contiguous(), sin[rows].contiguous(), keys, values, first,
                       heads, kv_heads, None))
        first += size
    return torch.cat(outs), keys, values


def reference(qkv, cos, sin, heads, kv_heads, dim):
    """Causal attention in float64 after the kernels' RoPE (rotate-half), from first principles."""
    tokens = qkv.shape[0]
    x = qkv.double().view(tokens, heads + 2 * kv_heads, dim)

    def rope(t):
        half = torch.cat([-t[..., dim // 2:], t[..., : dim // 2]], dim=-1)
        return t * cos.double()[:, None] + half * sin.double()[:, None]

    q, k, v = rope(x[:, :heads]), rope(x[:, heads: heads + kv_heads]), x[:, heads + kv_heads:]
    group = heads // kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / dim ** 0.5
    scores = scores.masked_fill(torch.ones(tokens, tokens, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(tokens, heads * dim)


KINDS = ["amx-bf16", "avx512-bf16", "float32"]


@pytest.fixture(params=KINDS)
def kind(request, int4_kernel):
    """Each way prompt_attention can multiply that this CPU has (restored after)."""
    default = int4_kernel.prompt_attention_kind()
    try:
        int4_kernel.set_prompt_attention_kind(request.param)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    yield request.param
    int4_kernel.set_prompt_attention_kind(default)


def test_the_default_is_amx_where_the_cpu_has_it_else_what_this_machine_measured(int4_kernel):
    """AMX tiles where the CPU has them; else float32 until a prompt twin's heads were timed, then the kind
    the machine's stored choice names where the CPU has AVX-512 BF16 (float32 where none could be stored)."""
    choice.choose_prompt_attention(int4_kernel, 128)  # a no-op where this process already chose
    if int4_kernel.amx_bf16_ready():
        expected = "amx-bf16"
    elif int4_kernel.avx512_bf16_ready():
        stored = choice._read_choice(choice.choice_file())
        expected = stored["kind"] if stored else "float32"
    else:
        expected = "float32"
    assert int4_kernel.prompt_attention_kind() == expected
    with pytest.raises(RuntimeError, match="unknown prompt attention"):
        int4_kernel.set_prompt_attention_kind("fp8")


class _TimedOps:
    """The extension's prompt-attention calls, with each kind taking a set time on its own clock (the
    chooser's view; the first call of each kind, a warm-up, takes 1 s and must not count)."""

    def __init__(self, seconds: dict[str, float], amx: bool = False) -> None:
        self.seconds, self.kind, self.calls, self.now, self.amx = seconds, "float32", [], 0.0, amx

    def clock(self) -> float:
        return self.now

    def prompt_attention_kind(self) -> str:
        return self.kind

    def set_prompt_attention_kind(self, kind: str) -> None:
        self.kind = kind

    def avx512_bf16_ready(self) -> bool:
        return True

    def amx_bf16_ready(self) -> bool:
        return self.amx

    def prompt_attention(self, qkv, cos, sin, keys, values, start, heads, kv_heads, mask) -> None:  # noqa: ANN001
        assert (heads, kv_heads, cos.shape[1]) == choice.REFERENCE_HEADS and mask is None
        assert qkv.shape == (choice.CHOICE_TOKENS, (heads + 2 * kv_heads) * cos.shape[1])
        self.now += self.seconds[self.kind] if self.kind in self.calls else 1.0
        self.calls.append(self.kind)


def new_process(monkeypatch) -> None:  # noqa: ANN001
    """The chooser as a new process sees it: nothing chosen yet, no module given a kind."""
    monkeypatch.setattr(choice, "_prompt_attention_choice", {})
    monkeypatch.setattr(choice, "_modules_given", set())


class _OlderBuild(_TimedOps):
    """An extension built before the avx512-bf16 kind (benchmarks/kernel_ab.py's base): no avx512_bf16_ready."""

    def __getattribute__(self, name: str):  # noqa: ANN204
        if name == "avx512_bf16_ready":
            raise AttributeError(name)
        return super().__getattribute__(name)


@pytest.fixture
def fresh_process(monkeypatch):
    new_process(monkeypatch)


@pytest.mark.parametrize("bf16_seconds,chosen", [(0.002, "avx512-bf16"), (0.0037, "avx512-bf16"), (0.0039, "float32"),
                                                 (0.006, "float32")])
def test_the_chooser_keeps_vdpbf16ps_only_where_it_timed_clearly_faster(fresh_process, tmp_path, bf16_seconds, chosen):
    """Both kinds timed interleaved on the reference heads, whatever the model's; bf16 kept only under 0.95x
    float32's time (level, as on Intel's AVX-512 cores, stays float32); chosen once per process, and a
    kind set afterwards (tests, measurements) is not overridden by a later model's twin."""
    ops = _TimedOps({"float32": 0.004, "avx512-bf16": bf16_seconds})
    assert choice.choose_prompt_attention(ops, 64, clock=ops.clock, cache=tmp_path / "c.json") == chosen == ops.kind
    runs = choice.CHOICE_REPEATS + 1
    assert sorted(ops.calls) == ["avx512-bf16"] * runs + ["float32"] * runs
    assert ops.calls[:4] == ["avx512-bf16", "float32", "float32", "avx512-bf16"]  # interleaved, order alternating
    assert choice.prompt_attention_timings() == pytest.approx({"float32": 0.004, "avx512-bf16": bf16_seconds})
    ops.kind, ops.calls = "float32", []
    assert choice.choose_prompt_attention(ops, 128, clock=ops.clock, cache=tmp_path / "c.json") == "float32"
    assert ops.calls == [] and ops.kind == "float32"
    other_build = _TimedOps({"float32": 0.004, "avx512-bf16": 0.001})  # a second extension module, same process
    assert choice.choose_prompt_attention(other_build, 64, clock=other_build.clock) == chosen == other_build.kind
    assert other_build.calls == []


def test_later_processes_on_the_machine_read_the_first_ones_choice(monkeypatch, tmp_path):
    """The kinds give different prompt-cache bits, so a choice re-timed on a busy machine could change a greedy
    answer between runs: the first process stores it, later ones read it (another model, another moment);
    an unreadable file is timed again and replaced."""
    stored = tmp_path / "prompt_attention" / "choice.json"
    first = _TimedOps({"float32": 0.004, "avx512-bf16": 0.002})
    new_process(monkeypatch)
    assert choice.choose_prompt_attention(first, 128, clock=first.clock, cache=stored) == "avx512-bf16"
    later = _TimedOps({"float32": 0.001, "avx512-bf16": 0.009})  # a busy moment would now say float32
    new_process(monkeypatch)
    assert choice.choose_prompt_attention(later, 64, clock=later.clock, cache=stored) == "avx512-bf16"
    assert later.calls == [] and later.kind == "avx512-bf16"
    assert choice.prompt_attention_timings() == pytest.approx({"float32": 0.004, "avx512-bf16": 0.002})
    stored.write_text("{not json")
    new_process(monkeypatch)
    later.kind = "float32"  # a new process's extension
    assert choice.choose_prompt_attention(later, 128, clock=later.clock, cache=stored) == "float32"
    assert len(later.calls) == 2 * (choice.CHOICE_REPEATS + 1)
    assert choice._read_choice(stored)["kind"] == "float32"
    assert list(stored.parent.iterdir()) == [stored]  # no temporary file left
    assert stored.stat().st_mode & 0o044 == 0o044  # readable by the home's other users


def test_a_process_that_timed_second_uses_the_first_ones_stored_choice(fresh_process, monkeypatch, tmp_path):
    """Two processes timing at once: the one that stores first wins, the other reads its file."""
    stored = tmp_path / "choice.json"

    def timed_while_another_stored(ops, clock):  # noqa: ANN001, ANN202
        stored.write_text('{"kind": "float32", "seconds": {"float32": 0.004, "avx512-bf16": 0.0041}}')
        return {"float32": 0.004, "avx512-bf16": 0.001}

    monkeypatch.setattr(choice, "_time_kinds", timed_while_another_stored)
    ops = _TimedOps({"float32": 0.004, "avx512-bf16": 0.001})
    assert choice.choose_prompt_attention(ops, 128, cache=stored) == "float32" == ops.kind
    assert choice.prompt_attention_timings() == {"float32": 0.004, "avx512-bf16": 0.0041}
    assert list(tmp_path.iterdir()) == [stored]


def test_where_the_choice_cannot_be_stored_prompts_stay_float32(fresh_process, tmp_path):
    """A read-only home: timing would choose per run, so every run gets float32 alike."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    ops = _TimedOps({"float32": 0.004, "avx512-bf16": 0.001})
    assert choice.choose_prompt_attention(ops, 128, clock=ops.clock, cache=blocked / "c.json") == "float32"
    assert ops.kind == "float32"


def test_the_chooser_times_nothing_where_there_is_nothing_to_choose(monkeypatch, tmp_path):
    """Heads not 32 wide (never bf16), AMX tiles (float32 set there on purpose stays), a kind already set
    other than float32, or an older build without the kind: no timing, nothing stored."""
    new_process(monkeypatch)
    ops = _TimedOps({"float32": 0.004, "avx512-bf16": 0.001})
    assert choice.choose_prompt_attention(ops, 40, cache=tmp_path / "c.json") == "float32" and ops.calls == []
    ops.amx = True
    assert choice.choose_prompt_attention(ops, 128, cache=tmp_path / "c.json") == "float32" and ops.calls == []
    new_process(monkeypatch)
    ops.amx, ops.kind = False, "avx512-bf16"
    assert choice.choose_prompt_attention(ops, 128, cache=tmp_path / "c.json") == "avx512-bf16" and ops.calls == []
    new_process(monkeypatch)
    old_build = _OlderBuild({"float32": 0.004, "avx512-bf16": 0.001})
    assert choice.choose_prompt_attention(old_build, 128, cache=tmp_path / "c.json") == "float32"
    assert old_build.calls == [] and choice.prompt_attention_timings() == {} and not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
def test_a_rows_bits_do_not_depend_on_how_the_prompt_is_split(int4_kernel, kind, heads, kv_heads, dim):
    """One pass of 300 tokens == passes of 37, 1, 100 and 162 (tiles of 16 tokens cut differently, a
    one-token pass, slot blocks of 32 half full): outputs and the cache bit for bit; close to float64."""
    ops = int4_kernel
    qkv, cos, sin = prompt(heads, kv_heads, dim, 300, seed=heads + dim)
    whole, keys, values = run_in_passes(ops.prompt_attention, qkv, cos, sin, heads, kv_heads, dim, [300], 310)
    split, split_keys, split_values = run_in_passes(ops.prompt_attention, qkv, cos, sin, heads, kv_heads, dim,
                                                    [37, 1, 100, 162], 310)
    assert torch.equal(whole, split)
    assert torch.equal(keys, split_keys) and torch.equal(values, split_values)
    expected = reference(qkv, cos, sin, heads, kv_heads, dim)
    assert torch.linalg.norm(whole.double() - expected) / torch.linalg.norm(expected) < 2e-2


@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
def test_prompt_attention_is_attention_where_bf16_does_not_run(int4_kernel, kind, heads, kv_heads, dim):
    """float32, heads not a multiple of 32 wide, a mask: attention's own bits. Otherwise (32-wide multiples,
    causal) bf16 products, so not attention's bits — they did run."""
    ops = int4_kernel
    qkv, cos, sin = prompt(heads, kv_heads, dim, 70, seed=5)
    fast, _, _ = run_in_passes(ops.prompt_attention, qkv, cos, sin, heads, kv_heads, dim, [70], 80)
    plain, _, _ = run_in_passes(ops.attention, qkv, cos, sin, heads, kv_heads, dim, [70], 80)
    assert torch.equal(fast, plain) == (kind == "float32" or dim % 32 != 0)
    mask = torch.ones(70, 70, dtype=torch.bool).tril()
    masked = [fn(qkv, cos, sin, torch.zeros(kv_heads, 80, dim), torch.zeros(kv_heads, 80, dim), 0, heads, kv_heads, mask)
              for fn in (ops.prompt_attention, ops.attention)]
    assert torch.equal(masked[0], masked[1])


@pytest.fixture(scope="module")
def twin_pair(tmp_path_factory, int4_kernel):
    """A 64-wide-head pair (the AMX path's shape) decoding in int4 with int8 prompt twins."""
    root = tmp_path_factory.mktemp("prompt-attention")
    load = lambda path, mode: specdec.load_model(path, quantize=mode, prompt_quantize="int8")  # noqa: E731
    return (load(make_tiny_model_dir(root / "t", TINY_QWEN2_Q4, seed=3), "int4"),
            load(make_tiny_model_dir(root / "d", TINY_QWEN2_Q4, seed=4), "int4-all"))


PROMPTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n    return", "The quick brown fox jumps over the lazy dog",
           "import os\nimport sys\n\nfor path in sys.argv[1:]:\n    print(os.path.getsize(path))"]


def test_only_the_twins_layers_run_prompt_attention(twin_pair):
    target, draft = twin_pair
    for model in (target, draft):
        assert model.backend.prompt_backend.decoder.layer_runner.prompt_passes
        assert not model.backend.decoder.layer_runner.prompt_passes


@pytest.mark.parametrize("spec", [specdec.SpecConfig(method="draft_model", num_speculative_tokens=3),
                                  specdec.SpecConfig(method="draft_suffix", num_speculative_tokens=4),
                                  specdec.SpecConfig(method="suffix", num_speculative_tokens=4)],
                         ids=["draft", "draft-suffix", "suffix"])
def test_speculative_output_is_plain_output(twin_pair, kind, spec):
    target, draft = twin_pair
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for text in PROMPTS:
        plain = specdec.generate(target, text, params)
        fast = specdec.generate(target, text, params, draft=None if spec.method == "suffix" else draft, spec=spec)
        assert fast.token_ids == plain.token_ids


def test_chunked_prefill_and_a_warm_prefix_cache_answer_as_one_pass(twin_pair, kind):
    """The server's chunked prompt passes (4 tokens a chunk) and a prompt continued from the prefix
    cache give each request the output of one prompt pass alone."""
    target, draft = twin_pair
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = [specdec.generate(target, text, params).token_ids for text in PROMPTS]
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3)
    batched = specdec.generate_batch(target, PROMPTS, params, draft=draft, spec=spec, max_num_seqs=3, prefill_chunk=4)
    assert [out.token_ids for out in batched] == alone
    longer = PROMPTS[0] + " fibonacci(n - 1) + fibonacci(n - 2)\n\nprint("
    cold = specdec.generate(target, longer, params).token_ids
    specdec.enable_prefix_caching(target, gb=0.1, block_size=8)
    try:
        specdec.generate(target, PROMPTS[0], params)
        warm = specdec.generate(target, longer, params)
    finally:
        target.backend.prefix_cache = None
    assert warm.stats.cached_prompt_tokens >= 8
    assert warm.token_ids == cold


def test_the_execution_line_says_how_prompt_attention_multiplies(twin_pair, kind):
    from specdec.cli.common import kernels_in_use

    target, draft = twin_pair
    line = kernels_in_use(target, draft)
    assert (f"prompt attention in {kind}" in line) == (kind != "float32")
    assert "prompt attention" in line or kind == "float32"
