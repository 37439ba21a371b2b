"""specdec: lossless speculative decoding for LLMs.

Public API: :func:`load_model`, :func:`generate`, :func:`generate_batch`, :func:`stream`, :class:`SamplingParams`,
:class:`SpecConfig`, :class:`Stats`, :class:`StructuredOutput`, :func:`enable_prefix_caching`, :func:`reset_suffix_cache`,
:func:`set_suffix_cache_entries`;
for a drafter of your own :class:`Drafter`, :class:`Draft`, :class:`DrafterResources`, :class:`MethodInfo`, :func:`register_method`.
Imported lazily so ``import specdec.errors`` (and the CLI's
``--help``) does not pay for torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
_EXPORTS = {
    "LoadedModel": "specdec.api",
    "generate": "specdec.api",
    "enable_prefix_caching": "specdec.api",
    "reset_suffix_cache": "specdec.api",
    "set_suffix_cache_entries": "specdec.api",
    "generate_batch": "specdec.batch",
    "load_model": "specdec.api",
    "stream": "specdec.api",
    "SpecConfig": "specdec.config",
    "SpecdecError": "specdec.errors",
    "SamplingParams": "specdec.sampling",
    "Stats": "specdec.stats",
    "StructuredOutput": "specdec.structured",
    # your own drafter (README "Custom drafters")
    "Draft": "specdec.drafters.base",
    "Drafter": "specdec.drafters.base",
    "DrafterResources": "specdec.drafters.base",
    "MethodInfo": "specdec.drafters.base",
    "register_method": "specdec.drafters.registry",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
