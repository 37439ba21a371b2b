"""Methods from installed packages (entry-point group ``specdec.methods``) reach every command: `register_method`
reaches only the process it runs in, and each `specdec` command (and each Ray replica) is a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

PLUGIN = '''
import specdec


class LastOccurrence(specdec.Drafter):
    name = "last_occurrence"

    def propose(self, context_ids, k):
        for start in range(len(context_ids) - 2, -1, -1):
            if context_ids[start] == context_ids[-1]:
                return specdec.Draft(tokens=context_ids[start + 1 : start + 1 + k])
        return specdec.Draft(tokens=[])


METHOD = specdec.MethodInfo("last_occurrence", lambda res: LastOccurrence(), "what followed the last token before")
'''


def install_plugin(root: Path, entry: str = "specdec_plugin_demo:METHOD") -> Path:
    """A package as pip leaves one: its module and a dist-info folder naming the entry point."""
    (root / "specdec_plugin_demo.py").write_text(PLUGIN)
    info = root / "specdec_plugin_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: specdec-plugin-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[specdec.methods]\nlast_occurrence = {entry}\n")
    return root


def specdec_command(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(Path(__file__).parents[1])]))
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True, timeout=300, env=env)


def test_an_installed_method_reaches_every_command(tmp_path, tiny_dirs):
    root = install_plugin(tmp_path)
    listed = specdec_command(root, "methods")
    assert listed.returncode == 0 and "last_occurrence" in listed.stdout
    run = specdec_command(root, "generate", "a b a b a b", "--model", str(tiny_dirs["target"]), "--quantize", "none",
                          "--method", "last-occurrence", "--max-tokens", "8", "--compare-plain")
    assert run.returncode == 0, run.stderr
    assert "method=last_occurrence" in run.stderr and "identical text: yes" in run.stderr
    certified = specdec_command(root, "verify", "--skip-greedy", "--methods", "last_occurrence", "--samples", "300")
    assert "last_occurrence" in certified.stdout, certified.stderr


def test_a_broken_plugin_is_a_warning_and_the_built_ins_still_work(tmp_path, monkeypatch):
    from importlib.metadata import EntryPoint

    from specdec.drafters import registry

    broken = [EntryPoint("missing", "no_such_module_anywhere:METHOD", registry.ENTRY_POINT_GROUP),
              EntryPoint("not_a_method", "os:sep", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(registry, "entry_points", lambda group: broken if group == registry.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert "draft_suffix" in registry.method_names()
    messages = [str(w.message) for w in caught if issubclass(w.category, registry.PluginWarning)]
    assert len(messages) == 2 and "'missing'" in messages[0] and "not a specdec.MethodInfo" in messages[1]
    with pytest.raises(Exception, match="unknown speculative method 'missing'"):
        registry.method_info("missing")
