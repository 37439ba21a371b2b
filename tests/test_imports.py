"""Every module of ``specdec`` imports on its own, first, in an interpreter that has imported no
other part of specdec: an import cycle or an import that only works after another module ran shows
up as the ImportError a user would get.

A fresh ``python -c "import X"`` per module would re-import torch each time (seconds, ~50 modules),
so one interpreter imports the third-party packages specdec uses — and no specdec module — and forks
a child per module: each child starts with no ``specdec`` in ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_architecture import iter_module_names, third_party_imports

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import importlib, json, os, sys, traceback
modules, preload = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for name in preload:  # what every child would import anyway; a failure here is the child's to report
    try:
        importlib.import_module(name)
    except Exception:
        pass
assert not any(m == "specdec" or m.startswith("specdec.") for m in sys.modules), "preload imported specdec"
results = {}
for module in modules:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: import one module, send back the traceback (empty = fine)
        os.close(read)
        try:
            importlib.import_module(module)
            message = b""
        except BaseException:
            message = traceback.format_exc().encode()
        with os.fdopen(write, "wb") as out:
            out.write(message)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as inp:
        message = inp.read().decode()
    _, status = os.waitpid(pid, 0)
    if status and not message:
        message = f"child exited with status {status}"
    results[module] = message
print(json.dumps(results))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (one child per module)")
def test_every_module_imports_first_in_a_fresh_interpreter():
    modules = iter_module_names()
    assert "specdec.server.app" in modules and "specdec.drafters.layer_skip" in modules
    preload = sorted({name for module in modules for name in third_party_imports(module)})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(modules), json.dumps(preload)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(results) == modules
    failed = {module: message for module, message in results.items() if message}
    assert not failed, "\n".join(f"--- import {module} (first, fresh interpreter):\n{message}" for module, message in failed.items())


def test_an_import_cycle_fails_in_a_fresh_interpreter(tmp_path):
    """The harness itself: a package whose modules import each other by name fails when one of them
    is imported first (the failure the real test guards against)."""
    package = tmp_path / "cyc"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyc.b import B\nA = 1\n")
    (package / "b.py").write_text("from cyc.a import A\nB = 2\n")
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(["cyc.a", "cyc.b"]), "[]"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    results = json.loads(proc.stdout)
    assert "partially initialized module" in results["cyc.a"] and "partially initialized module" in results["cyc.b"]
