"""The ``specdec`` command line. One module per command, each with ``add_parser(subparsers)`` and
``run(args) -> int``; the flags they share live in :mod:`specdec.cli.common`, their value types in :mod:`specdec.cli.values`.

Commands:

- ``generate``        one completion: text streams to stdout, speculative stats to stderr (``cli/generate.py``)
- ``verify``          the lossless certificate: greedy identity on real prompts + distribution tests (``cli/verify.py``)
- ``bench``           Spec-Bench-style benchmark of methods and peers, with report and plots (``cli/bench.py``)
- ``serve``           OpenAI-compatible HTTP server with speculative decoding (``cli/serve.py``)
- ``tune``            measure the drafters and γ on your prompts, write the fastest as a ``--config`` file (``cli/tune.py``)
- ``train-drafter``   train an EAGLE head on the target's own features, with a report (``cli/train_drafter.py``)
- ``datastore build`` build the corpus datastore ``--method retrieval`` drafts from (``cli/datastore.py``)
- ``calibrate-skip``  measure which layers ``--method layer-skip`` should skip, save the fastest set (``cli/calibrate.py``)
- ``models``          list the built-in models, or pull one (``cli/models.py``)
- ``methods``         list the speculative methods: aliases, needs, options read (``cli/methods.py``)
- ``export``          the configuration as vLLM / SGLang / llama.cpp flags (``cli/export.py``)

Every user mistake is one clear line on stderr and a non-zero exit; ``--debug`` shows the traceback.
Nothing below this package prints to the screen.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import warnings
from typing import Callable

from specdec import __version__
from specdec.cli import bench, calibrate, datastore, export, generate, methods, models, serve, train_drafter, tune, verify
from specdec.cli.checks import apply_config, refuse_unused_flags
from specdec.errors import SpecdecError, UnreadOptionWarning

#: in the order ``specdec --help`` lists them
COMMANDS = (generate, verify, bench, serve, tune, train_drafter, datastore, calibrate, models, methods, export)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for LLMs.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--version", action="version", version=f"specdec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    for each in all_parsers(parser):
        # a value that starts like a negative number is a value: Python < 3.13 read `--gammas -2,abc` as a
        # second option ("expected one argument") and never showed our message for the bad γ
        each._negative_number_matcher = re.compile(r"^-\.?\d")
    return parser


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every sub-parser below it (commands, and ``datastore build``)."""
    found, stack = [], [parser]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(choice for action in current._actions if isinstance(action, argparse._SubParsersAction)
                     for choice in action.choices.values())
    return found


def typed_flags(argv: list[str] | None) -> set[str]:
    """The destinations the command line gave explicitly (a value equal to the default included):
    the same parser with every default suppressed leaves only those in the namespace."""
    parser = build_parser()
    for current in all_parsers(parser):
        current._defaults.clear()  # set_defaults(...) values (bench's draft model) are defaults too
        for action in current._actions:
            action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The sub-parser of ``command`` (``generate``, ``serve`` …)."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[command]


def show_plugin_warnings_plainly() -> None:
    """A broken method plugin (:class:`~specdec.drafters.registry.PluginWarning`, raised while ``--method``'s help
    lists the methods) is one ``warning: …`` line, as the CLI's other warnings are — not Python's warning format
    pointing at a line of specdec's registry. Other warnings keep Python's format."""
    from specdec.drafters.registry import PluginWarning

    shown = warnings.showwarning
    if getattr(shown, "plugin_lines", False):  # main() called again in this process (tests)
        return

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202 - warnings' hook
        if issubclass(category, PluginWarning):
            print(f"warning: {message}", file=file or sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    show.plugin_lines = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    show_plugin_warnings_plainly()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.debug:  # a first run on a machine pauses while step costs are timed (seconds): say so
        logging.getLogger("specdec.step_costs").setLevel(logging.INFO)
    func: Callable[[argparse.Namespace], int] = args.func
    # the library's UnreadOptionWarning repeats, as a Python warning with a source line, what the CLI's own
    # flag checks said before loading (cli/checks.py)
    warnings.filterwarnings("ignore", category=UnreadOptionWarning)
    try:
        typed = typed_flags(argv)
        args.typed_flags = typed  # what a command reads to tell a typed flag from a default (bench --compare)
        refuse_unused_flags(args, typed)
        if getattr(args, "config", None):
            apply_config(args, typed, command_parser(parser, args.command))
        return func(args)
    except SpecdecError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `specdec … | head`: the reader left; say nothing, as other Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 141  # 128 + SIGPIPE, the shell's status for a command ended by a closed pipe
    except OSError as exc:  # a path the user gave that cannot be read or written (the commands check most first)
        if args.debug:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
