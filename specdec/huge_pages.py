"""A CPU model's weights on transparent huge pages (2 MiB), where Linux offers them on request.

Why: a decode step streams every weight once, and on 4 KiB pages that stream crosses a page every
4 KiB — each crossing a TLB miss and a stop for the hardware prefetcher, which never follows a stream
into the next page. Most distributions set transparent huge pages to ``madvise``: memory gets them
only where a process asks (``madvise(MADV_HUGEPAGE)`` on 2 MiB-aligned ranges), and torch's allocator
never asks. Measured on a 2-core Xeon (KVM, AVX-512/AMX; ``benchmarks/huge_pages_ab.py``): the 4-bit
kernel's single-row linears from DRAM read 23.4 → 26.4 GB/s, the pure streaming limit being ~27-30.

How: the CPU storages of at least ``MIN_BYTES`` are copied into one anonymous mapping aligned to 2 MiB
and advised (one arena per model: a mapping per storage would leave each one's last huge page mostly
empty), and every tensor viewing them is re-pointed in place (``Tensor.set_``), so views stay views
(fused projections and their parts, a head and its first rows) and everything holding the tensor — a
module, the C++ layer loop's list — sees the new memory. Values are unchanged bit for bit; only where
they live moves. A CPU KV cache gets an arena of its own when made (:func:`zeros_on_huge_pages`).
``SPECDEC_HUGE_PAGES=0`` (or false/no/off) turns both off; they do nothing where the kernel's setting
is ``never`` or the platform has no ``MADV_HUGEPAGE``.
"""

from __future__ import annotations

import functools
import mmap
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import torch
from torch import nn

from specdec.config import env_switch

#: the huge page size the mappings are aligned to (x86-64 and arm64 with 4 KiB base pages)
HUGE_PAGE = 2 << 20
#: storages smaller than this stay where they are (norm weights and the like: not what a step streams)
MIN_BYTES = 64 << 10
#: each storage starts on a cache line of the arena (the kernels' alignment: AMX copies need 64 bytes)
ALIGN = 64
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
#: the arenas alive now, by the address of their storage: a storage found here was moved already
_ARENAS: "weakref.WeakValueDictionary[int, mmap.mmap]" = weakref.WeakValueDictionary()


def huge_pages_supported() -> bool:
    """Whether advising huge pages can do anything here: Linux with ``MADV_HUGEPAGE``, transparent huge
    pages not ``never``, and not turned off by ``SPECDEC_HUGE_PAGES=0`` (or false/no/off, as every
    on/off switch of specdec reads: config.env_switch). Asked at every model load and KV cache."""
    return env_switch("SPECDEC_HUGE_PAGES") and _kernel_offers_huge_pages()


@functools.lru_cache(maxsize=1)
def _kernel_offers_huge_pages() -> bool:
    """The kernel's side, read once (the sysfs setting is the machine's, not something a run changes)."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in THP_SETTING.read_text()
    except OSError:
        return False


def in_arena(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory is one of :func:`move_to_huge_pages`' arenas."""
    return tensor.untyped_storage().data_ptr() in _ARENAS


def _arena(nbytes: int) -> torch.Tensor:
    """``nbytes`` of uint8 starting on a 2 MiB boundary of an anonymous mapping advised for huge pages.
    The tensor owns the mapping (torch.frombuffer holds a reference to it): unmapped when the last
    tensor using it is freed. The slack before the boundary is never touched, so never resident."""
    size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE + HUGE_PAGE
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(region, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    region.madvise(mmap.MADV_HUGEPAGE, start, size - start)
    _ARENAS[whole.untyped_storage().data_ptr()] = region
    return whole[start:start + nbytes]


def _fault_in(arena: torch.Tensor) -> None:
    """Write a zero to every huge page of ``arena`` (which starts on one) from torch's threads at once. A
    fresh huge page's first write is most of a move's cost — the kernel zeroes 2 MiB, and on a VM the host
    may have to back them first: 1.7 GB took 4.1 s from one thread on the 2-core KVM guest after a minute
    idle, 2.3 s from two (0.2 s right after another process had freed the memory)."""
    pages = arena[::HUGE_PAGE]
    threads = min(max(1, torch.get_num_threads()), pages.numel())
    if threads == 1:
        pages.fill_(0)
        return
    inference = arena.is_inference()  # made under inference_mode (a head cut mid-request): a thread-local mode

    def fill(part: torch.Tensor) -> None:
        with torch.inference_mode(inference):
            part.fill_(0)

    with ThreadPoolExecutor(threads) as pool:  # fill_ releases the GIL
        list(pool.map(fill, pages.chunk(threads)))


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """A zero CPU tensor of ``shape`` in its own arena — a fresh anonymous mapping is zero, so nothing is
    written now and pages are faulted in as they are first used — or None where huge pages are not
    supported or it would be under MIN_BYTES (then ``torch.zeros``). For KV caches: at a long context a
    decode step streams the cached keys and values as it streams the weights (at 2 048 tokens ~50 MB a
    0.5B draft step on top of 0.26 GB of weights: that step 0.95x the time with them on huge pages)."""
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if nbytes < MIN_BYTES or not huge_pages_supported():
        return None
    return _arena(nbytes).view(dtype).view(shape)


def _cpu_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Every CPU tensor ``module`` holds, each once: its parameters and buffers, and what it keeps as plain
    attributes — tensors (a 4-bit layer's AMX copy: derived, so neither saved nor counted as a weight,
    but streamed like one), modules outside the module tree (fused projections, which the C++ layer
    loop calls while the tree's q/k/v layers are views of them) and dicts or lists of them (the LM
    head's cuts) — and so on through those modules."""
    seen: set[int] = set()
    tensors: list[torch.Tensor] = []
    pending, visited = [module], set()
    while pending:
        current = pending.pop()
        if id(current) in visited:
            continue
        visited.add(id(current))
        held: list[object] = []
        for value in vars(current).values():
            if isinstance(value, dict):
                held.extend(value.values())
            else:
                held.extend(value if isinstance(value, (list, tuple)) else [value])
        pending.extend(value for value in held if isinstance(value, nn.Module))
        pending.extend(current.children())
        for tensor in (*current.parameters(recurse=False), *current.buffers(recurse=False),
                       *(value for value in held if isinstance(value, torch.Tensor))):
            plain = tensor.device.type == "cpu" and tensor.layout == torch.strided and not tensor.is_quantized
            if plain and id(tensor) not in seen:
                seen.add(id(tensor))
                tensors.append(tensor)
    return tensors


@torch.no_grad()
def move_to_huge_pages(module: nn.Module, min_bytes: int | None = None, skip: Iterable[torch.Tensor] = ()) -> int:
    """Copy the CPU storages of ``module``'s tensors of at least ``min_bytes`` (default MIN_BYTES) into one
    arena on huge pages (each at a 64-byte boundary) and re-point their tensors there (module docstring);
    returns the bytes moved (0 where :func:`huge_pages_supported` is False). The storages of ``skip``'s
    tensors stay (tables read a row per token: nothing streamed). A storage already in an arena stays:
    calling it again, or on a module sharing moved tensors, moves only what is new. The originals are
    freed as their tensors move (unless something else still holds them)."""
    if not huge_pages_supported():
        return 0
    min_bytes = MIN_BYTES if min_bytes is None else min_bytes
    skipped = {tensor.untyped_storage().data_ptr() for tensor in skip}
    by_storage: dict[int, list[torch.Tensor]] = {}
    for tensor in _cpu_tensors(module):
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if storage.nbytes() >= min_bytes and address not in _ARENAS and address not in skipped:
            by_storage.setdefault(address, []).append(tensor)
    if not by_storage:
        return 0
    offsets, total = {}, 0
    for address, tensors in by_storage.items():
        offsets[address] = total
        total += -(-tensors[0].untyped_storage().nbytes() // ALIGN) * ALIGN
    arena = _arena(total)
    _fault_in(arena)
    target, base = arena.untyped_storage(), arena.storage_offset()  # bytes into the mapping
    for address, tensors in by_storage.items():
        storage = tensors[0].untyped_storage()
        start = offsets[address]
        arena[start:start + storage.nbytes()].copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
        for tensor in tensors:
            offset = (base + start) // tensor.element_size() + tensor.storage_offset()
            if tensor.is_inference():  # made under inference_mode: changed in place only there
                with torch.inference_mode():
                    tensor.set_(target, offset, tensor.size(), tensor.stride())
            else:
                tensor.set_(target, offset, tensor.size(), tensor.stride())
    return total
