"""Where specdec keeps what it caches: one function, read by every module that writes a cache.

It sits at the bottom of the package (imports nothing of specdec), so the model registry, the
weight converters, the kernel build and the calibration files all agree on one root.
"""

from __future__ import annotations

import os
from pathlib import Path


def specdec_home() -> Path:
    """Root of everything specdec caches: ``$SPECDEC_HOME`` if set (CI and tests point it
    elsewhere), else ``~/.cache/specdec``. Read on every call so a test can change it."""
    home = os.environ.get("SPECDEC_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "specdec"
