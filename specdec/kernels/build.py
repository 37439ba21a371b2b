"""The C++ extension ``specdec_cpu_kernels``: built once per machine, then imported.

It holds every CPU kernel of the quantized paths: the 4-bit, 6-bit and int8-weight linears
(``linear_kernels.cpp``, with AVX-512 VNNI and AVX-VNNI versions of their dot products in
``linear_kernels_avx512.cpp`` and ``linear_kernels_avxvnni.cpp``, chosen at run time by what the CPU
reports: :func:`kernel_paths`) and
the rest of a decoder layer — RMSNorm, RoPE, the KV-cache write,
attention (``layer_ops.cpp``; its inner loops on AVX-512 in ``attention_avx512.cpp``, the same bits);
on AMX CPUs the int8 GEMM and the 4-bit linear's calls of many rows also run on AMX tiles (``int8_gemm_amx.cpp``,
``linear_kernels_amx.cpp``, the same bits), and a prompt twin's attention on AMX-BF16 tiles
(``attention_amx.cpp``, other bits: prompt passes only) — or, on AVX-512 BF16 CPUs where it measures
faster, with vdpbf16ps (``attention_bf16.cpp``; both read ``bf16_rows.h``'s layout). The build (~40 s, g++ and ninja) lands in
``specdec_home()/ext/specdec_cpu_kernels-<key>``; the key hashes the sources, the compiler flags and
the torch and Python versions, so a change to any of them builds afresh instead of reusing a stale
library (builds of the extension under its old name, ``specdec_q4``, are never read).

Why the build runs in a child process: ``torch.utils.cpp_extension`` runs the ``ninja`` it finds on
``PATH``, and ninja (a dependency) is installed beside this interpreter — in a virtual environment's
``bin``, which is on ``PATH`` only when the environment is activated. The child gets that directory
on its ``PATH``; this process's environment is never written (library code must not change a
process-wide setting under its caller's threads). A finished build is imported straight from its
directory, so later starts neither need nor run ninja.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator, Sequence

import torch

from specdec.errors import SpecdecError
from specdec.paths import specdec_home

#: the module name the sources are compiled under (``PYBIND11_MODULE(TORCH_EXTENSION_NAME, …)``)
EXTENSION_NAME = "specdec_cpu_kernels"
_HERE = Path(__file__).parent
#: compiled sources: the linear kernels (with the module definition), the rest of a layer
SOURCES = (_HERE / "linear_kernels.cpp", _HERE / "linear_kernels_q6q8.cpp", _HERE / "linear_kernels_avx512.cpp",
           _HERE / "linear_kernels_avxvnni.cpp",
           _HERE / "layer_ops.cpp", _HERE / "attention_avx512.cpp", _HERE / "attention_amx.cpp",
           _HERE / "attention_bf16.cpp",
           _HERE / "layer_stack.cpp", _HERE / "int8_gemm.cpp", _HERE / "int8_gemm_avx512.cpp",
           _HERE / "int8_gemm_amx.cpp", _HERE / "linear_kernels_amx.cpp")
HEADERS = (_HERE / "simd.h", _HERE / "dot_kernels.h", _HERE / "tile_schedule.h", _HERE / "amx_tiles.h",
           _HERE / "linear_common.h", _HERE / "bf16_rows.h")
#: -ffp-contract=off: no fused multiply-adds the source does not write, so results do not depend on
#: the compiler's choices (bit-identity of a row alone and in a chunk is checked with torch.equal)
CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off")
LDFLAGS = ("-fopenmp",)

#: what the child process runs: torch's JIT build, arguments as one JSON string
_BUILD_SCRIPT = """
import json, sys
from torch.utils.cpp_extension import load
args = json.loads(sys.argv[1])
load(name=args["name"], sources=args["sources"], extra_cflags=args["cflags"], extra_ldflags=args["ldflags"],
     build_directory=args["build_directory"])
"""


def unsupported_reason() -> str | None:
    """Why this machine cannot run the extension, or None when it can (it may still fail to build)."""
    if not sys.platform.startswith("linux") or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "the C++ CPU kernels need an x86 CPU with AVX2 on Linux"
    return None


@functools.lru_cache(maxsize=1)
def build_key() -> str:
    """12 hex digits naming this exact build: its sources, compiler flags, torch and Python versions.
    Also keys what was measured with it (``specdec.step_costs``), so a kernel change re-measures."""
    key = hashlib.sha1()
    for path in SOURCES + HEADERS:
        key.update(path.name.encode() + b"\0" + path.read_bytes())
    key.update(json.dumps([CFLAGS, LDFLAGS, torch.__version__, sys.version_info[:2]]).encode())
    return key.hexdigest()[:12]


def build_directory() -> Path:
    """Where this exact build (sources, flags, torch, Python) lives."""
    return specdec_home() / "ext" / f"{EXTENSION_NAME}-{build_key()}"


#: set by :func:`layers_built_with`: the module :func:`kernel` returns instead of this build
_substitute: ModuleType | None = None


def kernel() -> ModuleType:
    """The compiled module, built first if this machine has no build of these sources yet.
    Raises :class:`SpecdecError` (with the way out: int8) where it cannot be built or loaded."""
    return _substitute if _substitute is not None else _this_build()


@contextlib.contextmanager
def layers_built_with(module: ModuleType) -> Iterator[None]:
    """Kernel layers made inside take ``module`` (another build: :func:`build_from`) instead of this
    one; a layer keeps the module it was made with. For benchmarks that hold one model per build in
    one process and time them forward for forward (benchmarks/kernel_ab.py): separate processes
    differ by more than a kernel change on a shared machine."""
    global _substitute
    previous, _substitute = _substitute, module
    try:
        yield
    finally:
        _substitute = previous


def build_from(source_dir: Path, name: str) -> ModuleType:
    """Build (once: into ``source_dir/build``) and import another copy of the kernel sources — an
    earlier revision's, say — as the module ``name``, so it loads beside this build."""
    directory = source_dir / "build"
    library = directory / f"{name}.so"
    if not library.is_file():  # the sources that revision had (a later one may have added files)
        _build(directory, [source_dir / path.name for path in SOURCES if (source_dir / path.name).is_file()], name)
    return _import(library, name)


@functools.lru_cache(maxsize=1)
def _this_build() -> ModuleType:
    reason = unsupported_reason()
    if reason is not None:
        raise SpecdecError(f"{reason}; use --quantize int8 (quantize='int8')")
    directory = build_directory()
    library = directory / f"{EXTENSION_NAME}.so"
    built_now = False
    if not library.is_file():
        _build(directory)
        built_now = True
    try:
        return _loaded(_import(library))
    except ImportError as exc:
        if built_now:
            raise SpecdecError(f"the C++ CPU kernels built but do not load: {exc}; use --quantize int8 (quantize='int8')") from exc
    # a library left broken (an interrupted link): build it again, once
    library.unlink(missing_ok=True)
    _build(directory)
    try:
        return _loaded(_import(library))
    except ImportError as exc:
        raise SpecdecError(f"the C++ CPU kernels built but do not load: {exc}; use --quantize int8 (quantize='int8')") from exc


def _loaded(module: ModuleType) -> ModuleType:
    """``module`` with the kernel path ``SPECDEC_KERNEL_PATH`` names, when set (to compare paths with
    whole commands, e.g. ``SPECDEC_KERNEL_PATH=avx2 specdec generate …``; outputs are the same bits), and
    the 4-bit linear's AMX threshold ``SPECDEC_Q4_AMX_ROWS`` sets (rows per call from which it runs on
    AMX tiles where the CPU has them; 0: never; the same bits either way)."""
    wanted = os.environ.get("SPECDEC_KERNEL_PATH", "").strip()
    if wanted:
        if wanted not in module.kernel_paths():
            raise SpecdecError(f"SPECDEC_KERNEL_PATH={wanted}: this CPU runs {', '.join(module.kernel_paths())}")
        module.set_kernel_path(wanted)
    rows = q4_amx_rows_from_env()
    if rows is not None:
        module.set_q4_amx_min_rows(rows)
    return module


def q4_amx_rows_from_env() -> int | None:
    """``SPECDEC_Q4_AMX_ROWS`` as a number of rows (0: never AMX), None when unset; a clear error otherwise.
    Read here only: the threshold (:func:`_loaded`) and whether 4-bit layers make their AMX copy
    (``q4.amx_copies_wanted``) must agree on what the variable says."""
    rows = os.environ.get("SPECDEC_Q4_AMX_ROWS", "").strip()
    if not rows:
        return None
    if not rows.isdigit():
        raise SpecdecError(f"SPECDEC_Q4_AMX_ROWS={rows!r}: a number of rows (0: never AMX)")
    return int(rows)


def amx_key() -> str:
    """``-amx<rows>``, the 4-bit AMX threshold in use where the CPU runs AMX tiles (0: never), else "": part
    of the step-cost cache's name, since the threshold (``SPECDEC_Q4_AMX_ROWS``) moves the int4 target's
    chunk costs from that many rows on."""
    module = kernel()
    return f"-amx{int(module.q4_amx_min_rows())}" if module.amx_q4_ready() else ""


def available() -> bool:
    """Whether :func:`kernel` works here (builds it on first use)."""
    try:
        kernel()
    except SpecdecError:
        return False
    return True


def kernel_paths() -> list[str]:
    """The dot-product paths (instruction sets) this CPU runs, best first, e.g. ``["avx512-vnni", "avx2"]``.
    Every path gives the same output bits (``dot_kernels.h``); they differ only in speed."""
    return list(kernel().kernel_paths())


def kernel_path() -> str:
    """The path the linear and attention kernels use now: the best this CPU has unless :func:`use_kernel_path` chose."""
    return str(kernel().kernel_path())


@contextlib.contextmanager
def use_kernel_path(name: str) -> Iterator[None]:
    """Run the kernels with path ``name`` inside the block (tests and benchmarks compare paths; the
    setting is process-wide). Raises :class:`SpecdecError` when this CPU cannot run it."""
    if name not in kernel_paths():
        raise SpecdecError(f"kernel path {name!r} does not run on this CPU (it runs {', '.join(kernel_paths())})")
    previous = kernel_path()
    kernel().set_kernel_path(name)
    try:
        yield
    finally:
        kernel().set_kernel_path(previous)


@contextlib.contextmanager
def use_q4_amx_rows(rows: int) -> Iterator[None]:
    """Run 4-bit linears of ``rows`` rows or more on AMX tiles inside the block (0: never; tests and
    benchmarks compare AMX with VNNI, the same bits; the setting is process-wide), restored after."""
    module = kernel()
    previous = int(module.q4_amx_threshold())
    module.set_q4_amx_min_rows(rows)
    try:
        yield
    finally:
        module.set_q4_amx_min_rows(previous)


def _build(directory: Path, sources: Sequence[Path] = SOURCES, name: str = EXTENSION_NAME) -> None:
    """Run torch's JIT build in a child process with this interpreter's ``bin`` on its PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    args = {"name": name, "sources": [str(p) for p in sources], "cflags": list(CFLAGS),
            "ldflags": list(LDFLAGS), "build_directory": str(directory)}
    env = dict(os.environ)  # a copy for the child: this process's environment stays as it is
    env["PATH"] = os.pathsep.join(filter(None, (str(Path(sys.executable).parent), env.get("PATH"))))
    try:
        done = subprocess.run([sys.executable, "-c", _BUILD_SCRIPT, json.dumps(args)], env=env,
                              capture_output=True, text=True)
    except OSError as exc:
        raise SpecdecError(f"could not start the build of the C++ CPU kernels: {exc}; use --quantize int8 (quantize='int8')") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        raise SpecdecError(f"could not build the C++ CPU kernels (needs g++ and ninja): …{output[-2000:]}\n"
                           "use --quantize int8")


def _import(library: Path, name: str = EXTENSION_NAME) -> ModuleType:
    """Import the built library as ``torch.utils.cpp_extension.load`` does (not added to sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"{library} is not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
