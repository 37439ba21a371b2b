"""``specdec methods``: the speculative methods this install knows, read from the method registry
(:func:`specdec.drafters.registry.all_methods`) — built-ins, installed packages' ``specdec.methods`` entry
points and any registered with ``register_method`` — with their aliases, whether each needs ``--draft-model`` or specdec's torch
backend, and the :class:`~specdec.config.SpecConfig` options (flags) it reads."""

from __future__ import annotations

import argparse

from specdec.cli.common import add_debug_flag

HEADER = ("method", "aliases", "draft model", "torch backend", "options read", "summary")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    methods = subparsers.add_parser("methods", help="list the speculative methods: aliases, requirements, options they read",
                                    description="List every registered speculative method (the values --method takes): its "
                                                "aliases, whether it needs --draft-model, whether it runs the target's own layers "
                                                "and so needs specdec's torch backend, the SpecConfig options it reads (option "
                                                "x_y is the flag --x-y) and what it drafts from. Installed packages add methods through "
                                                "the entry-point group 'specdec.methods' (README: Custom drafters); the last "
                                                "lines name each such method's package.")
    add_debug_flag(methods)
    methods.set_defaults(func=run)
    return methods


def method_rows() -> list[tuple[str, ...]]:
    """One row per registered method, in HEADER's columns."""
    from specdec.drafters.registry import all_methods

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    return [(info.name, ", ".join(info.aliases) or "-", yes(info.needs_draft_model), yes(info.needs_torch_backend),
             ", ".join(f"{o} (required)" if o in info.requires else o for o in info.options) or "-", info.summary)
            for info in all_methods()]


def format_table(rows: list[tuple[str, ...]]) -> str:
    """Columns padded to their widest cell, two spaces apart; the last column (summary) is not padded."""
    table = [HEADER, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER) - 1)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]).rstrip() for row in table)


def run(args: argparse.Namespace) -> int:
    from specdec.drafters.registry import PLAIN_NAMES, plugin_sources

    print(format_table(method_rows()))
    for name, package in sorted(plugin_sources().items()):
        print(f"{name}: from the installed package {package} (entry point group specdec.methods)")
    print(f"plain decoding: omit --method (and --draft-model), or --method {'|'.join(PLAIN_NAMES)}; "
          "'-' and '_' are interchangeable in method names")
    return 0
