"""What this CPU can do, for choosing kernels and for keying measurements made on it.

CPUs differ between machines of the same kind (some are AVX2-only, others have AVX-512 VNNI or
AVX-VNNI), and a configuration measured fastest on one lost on the other; so results files record
:func:`cpu_flags`, and cached step-cost measurements are keyed by :func:`cpu_signature`. Sits at
the bottom of the package: imports nothing of specdec.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

#: the instruction-set flags that change which int8/int4 kernels are fastest here
RELEVANT_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or platform.machine(), frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() == "flags":
            flags = frozenset(value.split())
            break
    return model, flags


def cpu_flags() -> list[str]:
    """The relevant instruction-set flags this CPU reports (``/proc/cpuinfo``), in a fixed order."""
    flags = _cpuinfo()[1]
    return [f for f in RELEVANT_FLAGS if f in flags]


def cpu_description() -> str:
    """``model name [flags]``, for result files and ``--explain`` output."""
    return f"{_cpuinfo()[0]} [{' '.join(cpu_flags()) or 'no AVX2'}]"


def cpu_signature() -> str:
    """A short key for measurements that hold only on this kind of CPU (model name + flags)."""
    return hashlib.sha256(cpu_description().encode()).hexdigest()[:12]


#: assumed when the OS does not say (a server CPU's last-level cache is tens of MiB)
DEFAULT_LAST_LEVEL_CACHE = 32 * 2**20


@functools.lru_cache(maxsize=1)
def last_level_cache_bytes(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The largest CPU cache this machine reports (sysfs ``index*/size``), in bytes.

    Why it matters: a step-cost probe whose weights fit in it times cache reads, not the memory
    reads a real decode step pays (see :func:`specdec.step_probe.measure_curves`)."""
    sizes = []
    for index in cache_dir.glob("index*"):
        try:
            sizes.append(parse_cache_size((index / "size").read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes, default=0) or DEFAULT_LAST_LEVEL_CACHE


def parse_cache_size(text: str) -> int:
    """sysfs' cache size (``32768K``, ``2M``, ``512``) in bytes; ValueError if it is none of those."""
    text = text.strip().upper()
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def cpu_ticks() -> tuple[int, int, int] | None:
    """(busy ticks of every CPU — steal included: time the hypervisor gave others —, all ticks, this
    process's ticks), from ``/proc/stat`` and ``/proc/self/stat``; None where they are unreadable."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal, sum(fields), int(own[11]) + int(own[12])


def other_cpu_share(since: tuple[int, int, int] | None, now: tuple[int, int, int] | None = None) -> float:
    """The share of the machine's CPU time that other processes (or other guests, by steal) used
    between the :func:`cpu_ticks` readings ``since`` and ``now`` (default: read now) — 0.0 when unknown.
    A timing taken while it is high measured contention, not this machine."""
    now = now or cpu_ticks()
    if since is None or now is None or now[1] <= since[1]:
        return 0.0
    others = (now[0] - since[0]) - (now[2] - since[2])
    return max(0.0, others / (now[1] - since[1]))
