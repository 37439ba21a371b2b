"""How a prompt twin's attention multiplies on this CPU: chosen by timing, once per machine.

A prompt twin's causal attention (``prompt_attention`` in the C++ extension) runs its products in bf16 on
AMX tiles where the CPU has them; on a CPU with AVX-512 BF16 but no tiles (AMD Zen 4/5, Intel Cooper Lake) it
can run them with vdpbf16ps (attention_bf16.cpp). On AMD's cores that instruction does 32 products at the
rate of a 16-lane FMA — one 1.5B layer over 2 432 tokens went 72-82 -> 33-36 ms on a 2-core Zen 5 —, on
Intel's it issues on one port against the FMA's two and ran level with float32 (session 56). So the choice is
measured, not assumed: both kinds time a causal 512-token pass of the model's heads (interleaved, median of
5, ~40 ms), and vdpbf16ps is kept where it takes under 0.95x float32's time.

The result is stored per CPU, kernel build, head shape and thread count (``specdec_home()/prompt_attention``),
so every later process on the machine multiplies the same way: the two kinds give different prompt-cache bits,
and a choice re-timed on a busy machine must not change a greedy answer from one run to the next.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from specdec.cpu import cpu_signature
from specdec.kernels.build import build_key
from specdec.paths import specdec_home

#: the timed pass: tokens, timed repeats of each kind (after one warm-up each), and how much faster
#: vdpbf16ps must be to replace float32
CHOICE_TOKENS, CHOICE_REPEATS, CHOICE_MARGIN = 512, 5, 0.95
#: the kinds the chooser decides between (the extension's names)
TIMED_KINDS = ("avx512-bf16", "float32")
#: what this process chose (the extension's kind is process-wide, so it is chosen once): the kind and,
#: where timed here or on an earlier run, the two medians in seconds
_prompt_attention_choice: dict[str, Any] = {}


def choice_file(heads: int, kv_heads: int, head_dim: int) -> Path:
    """Where this machine's choice for these heads is kept: keyed by CPU, kernel build and threads."""
    name = f"{cpu_signature()}-{build_key()}-h{heads}x{kv_heads}x{head_dim}-t{torch.get_num_threads()}.json"
    return specdec_home() / "prompt_attention" / name


def choose_prompt_attention(ops: Any, heads: int, kv_heads: int, head_dim: int,
                            clock: Callable[[], float] = time.perf_counter, cache: Path | None = None) -> str:
    """How prompt passes multiply in attention in this process: set on ``ops`` (the extension) and returned.

    Decided once per process, by the first prompt twin with heads a multiple of 32 wide (narrower heads
    never run the bf16 kernels): where the extension still multiplies in float32 and the CPU has AVX-512
    BF16, the kind stored for this machine (``cache``, default :func:`choice_file`), else the faster of
    the two by the module's timing, then stored. A kind already other than float32 (AMX tiles) or one set
    after the choice (tests, ``set_prompt_attention_kind``) is left as it is. ``clock``: seconds (tests)."""
    if _prompt_attention_choice or head_dim % 32 != 0:
        return str(ops.prompt_attention_kind())
    current = str(ops.prompt_attention_kind())
    if current != "float32" or not ops.avx512_bf16_ready():
        _prompt_attention_choice["kind"] = current
        return current
    cache = cache or choice_file(heads, kv_heads, head_dim)
    stored = _read_choice(cache)
    if stored is None:
        seconds = _time_kinds(ops, heads, kv_heads, head_dim, clock)
        chosen = "avx512-bf16" if seconds["avx512-bf16"] < CHOICE_MARGIN * seconds["float32"] else "float32"
        stored = {"kind": chosen, "seconds": seconds}
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(stored))
        except OSError:  # a read-only home: chosen again by the next process
            pass
    ops.set_prompt_attention_kind(stored["kind"])
    _prompt_attention_choice.update(stored)
    return str(stored["kind"])


def prompt_attention_timings() -> dict[str, float]:
    """The medians (seconds) behind this process's choice, by kind; empty where nothing was timed (AMX
    tiles, no AVX-512 BF16, heads not 32 wide, no prompt twin yet)."""
    return dict(_prompt_attention_choice.get("seconds", {}))


def _time_kinds(ops: Any, heads: int, kv_heads: int, head_dim: int, clock: Callable[[], float]) -> dict[str, float]:
    """Each of TIMED_KINDS over one causal CHOICE_TOKENS-token pass of these heads: median seconds."""
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(CHOICE_TOKENS, (heads + 2 * kv_heads) * head_dim, generator=gen)
    angles = torch.rand(CHOICE_TOKENS, head_dim, generator=gen) * 6
    cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
    times: dict[str, list[float]] = {kind: [] for kind in TIMED_KINDS}
    for repeat in range(CHOICE_REPEATS + 1):  # the first of each: warm-up, not counted
        for kind in TIMED_KINDS if repeat % 2 == 0 else TIMED_KINDS[::-1]:
            ops.set_prompt_attention_kind(kind)
            cache = torch.zeros(2, kv_heads, CHOICE_TOKENS, head_dim)
            began = clock()
            ops.prompt_attention(qkv, cos, sin, cache[0], cache[1], 0, heads, kv_heads, None)
            if repeat:
                times[kind].append(clock() - began)
    return {kind: statistics.median(runs) for kind, runs in times.items()}


def _read_choice(path: Path) -> dict[str, Any] | None:
    """A stored choice, or None where there is none or it cannot be read (then it is timed again)."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("kind") not in TIMED_KINDS:
        return None
    return stored
