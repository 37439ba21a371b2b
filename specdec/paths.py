"""Where specdec keeps what it caches: one function, read by every module that writes a cache.

It sits at the bottom of the package (imports nothing of specdec), so the model registry, the
weight converters, the kernel build and the calibration files all agree on one root; and how a
safetensors file is written whole (:func:`write_safetensors`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def specdec_home() -> Path:
    """Root of everything specdec caches: ``$SPECDEC_HOME`` if set (CI and tests point it
    elsewhere), else ``~/.cache/specdec``. Read on every call so a test can change it."""
    home = os.environ.get("SPECDEC_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "specdec"


def write_safetensors(tensors: dict[str, Any], path: Path) -> None:
    """Write ``tensors`` to ``path`` whole or not at all (a ``.partial`` file renamed), readable as any
    file this process writes (the umask's mode): safetensors' writer makes its files 0600, so a trained
    head, a distilled draft or a feature shard could not be shared from the folder it was written to."""
    from safetensors.torch import save_file

    partial = path.with_name(path.name + ".partial")
    save_file(tensors, str(partial))
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(partial, 0o666 & ~mask)
    os.replace(partial, path)
