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
    assert "last_occurrence: from the installed package specdec-plugin-demo" in listed.stdout
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
    monkeypatch.setattr(registry, "_PLUGIN_FAILURES", {})
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        # the warning scrolled by when the plugins loaded: the unknown name says why it is unknown
        with pytest.raises(Exception, match="unknown speculative method 'missing': the installed plugin 'missing' "
                                            r"\(no_such_module_anywhere:METHOD\) did not load: ModuleNotFoundError"):
            registry.method_info("missing")
        with pytest.raises(Exception, match="unknown speculative method 'other'; available: "):
            registry.method_info("other")


def test_plugin_names_and_collisions_say_what_the_author_can_do(monkeypatch):
    """An entry point keyed "mine" for a MethodInfo named "other_name" registered only "other_name" (``--method mine``:
    unknown); a plugin taking a built-in's name was told to "pass replace=True", which an entry point cannot."""
    from importlib.metadata import EntryPoint

    from specdec.drafters import registry

    module = type(sys)("specdec_plugin_names_demo")
    module.RENAMED = registry.MethodInfo("other_name", lambda res: None, "its entry point says 'mine'")
    module.CLASH = registry.MethodInfo("ngram", lambda res: None, "a second ngram")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    points = [EntryPoint("mine", f"{module.__name__}:RENAMED", registry.ENTRY_POINT_GROUP),
              EntryPoint("ngram_again", f"{module.__name__}:CLASH", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(registry, "entry_points", lambda group: points if group == registry.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert registry.method_info("mine").name == "other_name"
        messages = [str(w.message) for w in caught if issubclass(w.category, registry.PluginWarning)]
        assert len(messages) == 1 and "'ngram_again'" in messages[0] and "already registered" in messages[0]
        assert "replace=True" not in messages[0] and "rename the plugin's MethodInfo" in messages[0]
        assert registry.method_info("ngram").summary != "a second ngram"
    finally:
        registry._METHODS.pop("other_name", None)


def test_a_broken_plugin_is_one_warning_line_on_the_command_line(tmp_path):
    """Python's warning format pointed at a line of specdec's registry (and printed it) before every command."""
    root = install_plugin(tmp_path, entry="no_such_module_anywhere:METHOD")
    listed = specdec_command(root, "methods")
    assert listed.returncode == 0 and "draft_suffix" in listed.stdout
    warning = [line for line in listed.stderr.splitlines() if "last_occurrence" in line]
    assert warning == [warning[0]] and warning[0].startswith("warning: specdec method plugin 'last_occurrence'")
    assert "registry.py" not in listed.stderr and "PluginWarning" not in listed.stderr


def test_a_failing_method_fails_its_own_rows_and_the_others_are_certified(monkeypatch):
    """verify stopped at the first method whose code raised (a traceback), and the rows already certified were lost."""
    from specdec import certify
    from specdec.drafters import registry

    registry.register_method(registry.MethodInfo("boom", lambda res: 1 / 0, "a factory that raises"))
    try:
        results = certify.run_certificate(None, None, ["boom", "ngram"], 0, 8, 300, greedy=False, configs=["T=1"])
    finally:
        registry._METHODS.pop("boom", None)
    verdicts = {(r.method, r.passed) for r in results}
    assert verdicts == {("boom", False), ("ngram", True)}, results
    assert "error: DrafterError: method 'boom': its factory failed: ZeroDivisionError" in results[0].detail


def test_a_plugin_that_registers_itself_or_has_two_keys_gets_its_aliases(monkeypatch):
    """The alias copy was a new object: a module that also registers its MethodInfo on import, or two entry-point keys
    naming one MethodInfo, read as a name clash (a warning, no alias)."""
    from importlib.metadata import EntryPoint

    from specdec.drafters import registry

    module = type(sys)("specdec_plugin_self_demo")
    module.METHOD = registry.MethodInfo("self_registered", lambda res: None, "registers itself on import")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    registry.register_method(module.METHOD)
    points = [EntryPoint(key, f"{module.__name__}:METHOD", registry.ENTRY_POINT_GROUP) for key in ("self-reg", "selfreg")]
    monkeypatch.setattr(registry, "entry_points", lambda group: points if group == registry.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            registry.load_plugins()
        assert not [w for w in caught if issubclass(w.category, registry.PluginWarning)]
        assert registry.method_info("self-reg").name == registry.method_info("selfreg").name == "self_registered"
    finally:
        registry._METHODS.pop("self_registered", None)
