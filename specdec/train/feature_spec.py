"""The form of ``--feature-layers`` (``train-drafter``): final, fused or layer numbers. One light
parser, read by the CLI before the target loads (a typo is refused in a second, not after loading a
model) and by the training job for library callers; whether the layers fit the target is checked by
:func:`specdec.train.pipeline.feature_layers` once its depth is known. Imports nothing heavy."""

from __future__ import annotations

from specdec.errors import SpecdecError


def parse_feature_layers(spec: str) -> str | tuple[int, ...]:
    """``"final"``, ``"fused"`` or the layer numbers ``spec`` names; a clear error for anything else."""
    if spec in ("final", "fused"):
        return spec
    try:
        return tuple(int(part) for part in spec.split(","))
    except ValueError:
        raise SpecdecError(f"--feature-layers {spec!r}: give final, fused or ascending layer numbers such as "
                           "2,14,28") from None
