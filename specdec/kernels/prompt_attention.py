"""How a prompt twin's attention multiplies on this CPU: chosen by timing, once per machine.

A prompt twin's causal attention (``prompt_attention`` in the C++ extension) runs its products in bf16 on
AMX tiles where the CPU has them; on a CPU with AVX-512 BF16 but no tiles (AMD Zen 4/5, Intel Cooper Lake) it
can run them with vdpbf16ps (attention_bf16.cpp). On AMD's cores that instruction does 32 products at the
rate of a 16-lane FMA — one 1.5B layer over 2 432 tokens took 0.45-0.57x the time on a 2-core Zen 5 —, on
Intel's it issues on one port against the FMA's two and ran level with float32 (session 56). So the choice is
measured, not assumed: both kinds time a causal 512-token pass of one reference shape (the 1.5B's heads: 12
query and 2 KV heads of 128; interleaved, median of 5, ~40 ms), and vdpbf16ps is kept where it takes under
0.95x float32's time.

The result is stored once per CPU and kernel build (``specdec_home()/prompt_attention``; the first process to
store it wins), and every later process on the machine reads it, whatever its models, their load order or its
thread count: the two kinds give different prompt-cache bits, so a re-timing on a busy machine must not
change a greedy answer from one run to the next. Where it cannot be stored (a read-only home) prompts stay
in float32, for the same reason.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from specdec.cpu import cpu_signature
from specdec.kernels.build import build_key
from specdec.paths import specdec_home

log = logging.getLogger(__name__)

#: the timed pass: tokens, timed repeats of each kind (after one warm-up each), how much faster vdpbf16ps
#: must be to replace float32, and the heads it is timed on (query heads, KV heads, head width)
CHOICE_TOKENS, CHOICE_REPEATS, CHOICE_MARGIN = 512, 5, 0.95
REFERENCE_HEADS = (12, 2, 128)
#: the kinds the chooser decides between (the extension's names)
TIMED_KINDS = ("avx512-bf16", "float32")
#: what this process chose (once): the kind and, where timed here or by an earlier process, the two medians
_prompt_attention_choice: dict[str, Any] = {}
#: the extension modules (by id) the choice was given to: the kind is process-wide within one module, and a
#: process may hold two builds (benchmarks/kernel_ab.py), each of which gets it once
_modules_given: set[int] = set()


def choice_file() -> Path:
    """Where this machine's choice is kept: one file per CPU and kernel build."""
    return specdec_home() / "prompt_attention" / f"{cpu_signature()}-{build_key()}.json"


def choose_prompt_attention(ops: Any, head_dim: int, clock: Callable[[], float] = time.perf_counter,
                            cache: Path | None = None) -> str:
    """How prompt passes multiply in attention in this process: set on ``ops`` (the extension) and returned.

    Decided once per process, by the first prompt twin with heads a multiple of 32 wide (``head_dim``;
    narrower heads never run the bf16 kernels), and given once to each extension module: on a CPU with
    AVX-512 BF16 and no AMX tiles whose extension still multiplies in float32, the kind stored for this
    machine (``cache``, default :func:`choice_file`), else the faster of the two by the module's timing,
    stored — or float32 where it cannot be stored. AMX tiles, or a kind set before (tests,
    ``set_prompt_attention_kind``) other than float32, are left as they are; so is a kind set on a module
    after it was given the choice. ``clock``: seconds (tests)."""
    if id(ops) in _modules_given or head_dim % 32 != 0:
        return str(ops.prompt_attention_kind())
    _modules_given.add(id(ops))
    current = str(ops.prompt_attention_kind())
    bf16_here = getattr(ops, "avx512_bf16_ready", lambda: False)()  # (an older build, e.g. kernel_ab's base)
    if current != "float32" or not bf16_here or ops.amx_bf16_ready():
        return current
    if _prompt_attention_choice.get("kind") not in TIMED_KINDS:  # chosen for no module of this process yet
        cache = cache or choice_file()
        stored = _read_choice(cache)
        if stored is None:
            try:
                seconds = _time_kinds(ops, clock)
            finally:
                ops.set_prompt_attention_kind("float32")
            chosen = "avx512-bf16" if seconds["avx512-bf16"] < CHOICE_MARGIN * seconds["float32"] else "float32"
            stored = _store_choice(cache, {"kind": chosen, "seconds": seconds})
        _prompt_attention_choice.clear()
        _prompt_attention_choice.update(stored)
    ops.set_prompt_attention_kind(_prompt_attention_choice["kind"])
    return str(_prompt_attention_choice["kind"])


def prompt_attention_timings() -> dict[str, float]:
    """The medians (seconds) behind this process's choice, by kind; empty where nothing was timed (AMX
    tiles, no AVX-512 BF16, heads not 32 wide, no prompt twin yet)."""
    return dict(_prompt_attention_choice.get("seconds", {}))


def _time_kinds(ops: Any, clock: Callable[[], float]) -> dict[str, float]:
    """Each of TIMED_KINDS over one causal CHOICE_TOKENS-token pass of REFERENCE_HEADS: median seconds."""
    heads, kv_heads, head_dim = REFERENCE_HEADS
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


def _store_choice(path: Path, choice: dict[str, Any]) -> dict[str, Any]:
    """Store ``choice`` unless another process stored one first (then that one is used); where nothing can
    be stored, float32 — the kind every run gets alike. The file is readable by every user of the home, so a
    server's account and a user's read the same choice."""
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
            tmp = Path(handle.name)
            json.dump(choice, handle)
        tmp.chmod(0o644)  # (a temporary file is its owner's only)
        try:
            os.link(tmp, path)  # atomic, and only where no file is yet: the first process wins
        except FileExistsError:
            if _unreadable_choice(path):  # a file that holds no choice (not one a process could not read): replaced
                os.replace(tmp, path)
    except OSError as exc:
        log.warning("prompt attention stays float32: cannot store this machine's choice in %s (%s)", path, exc)
        return {"kind": "float32"}
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    return _read_choice(path) or {"kind": "float32"}


def _read_choice(path: Path) -> dict[str, Any] | None:
    """A stored choice, or None where there is none or it cannot be read (then it is timed again)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    return _parse_choice(text)


def _unreadable_choice(path: Path) -> bool:
    """Whether ``path`` was read and holds no choice (corrupt or foreign), as opposed to not readable now."""
    try:
        return _parse_choice(path.read_text()) is None
    except OSError:
        return False


def _parse_choice(text: str) -> dict[str, Any] | None:
    try:
        stored = json.loads(text)
    except ValueError:
        return None
    if not isinstance(stored, dict) or stored.get("kind") not in TIMED_KINDS:
        return None
    seconds = stored.get("seconds", {})
    if not (isinstance(seconds, dict) and all(isinstance(v, (int, float)) for v in seconds.values())):
        stored["seconds"] = {}
    return stored
