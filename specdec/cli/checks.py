"""Flags checked against what the chosen methods and modes read, before any model loads: a method's
required path, method names, flags the method or command does not read (an error when the command never
reads them, a warning when only this method does not), and ``--config`` files' values checked as the flags'.
"""

from __future__ import annotations

import argparse
import sys

from specdec.errors import SpecdecError

#: method-specific flags → the SpecConfig field each sets (spec_from_args warns when the chosen
#: method does not read one the user changed)
METHOD_FLAGS = {
    "--datastore": "datastore",
    "--skip-layers": "skip_layers",
    "--exit-layer": "exit_layer",
    "--draft-vocab-size": "draft_vocab_size",
    "--draft-context-window": "draft_context_window",
    "--prompt-lookup-min": "prompt_lookup_min",
    "--prompt-lookup-max": "prompt_lookup_max",
    "--spec-tree": "spec_tree",
    "--drafter-path": "drafter_path",
}


def refuse_unused_flags(args: argparse.Namespace, typed: set[str]) -> None:
    """A flag the command accepts (the shared model flags) but does not read, typed on the command line: an
    error saying so (its help's words) — it was silently ignored. A ``--config`` file's settings may name
    them (a tune.json's method, for bench): those are not typed."""
    named = [(flag, message) for flag, (dest, message) in getattr(args, "unused_flags", {}).items() if dest in typed]
    if named:
        flag, message = named[0]
        raise SpecdecError(f"{flag}: {message}")


def apply_config(args: argparse.Namespace, typed: set[str], parser: argparse.ArgumentParser) -> None:
    """``--config FILE``: each setting of the file replaces its flag's value unless the user typed that
    flag (``typed``: the destinations given on the command line) — as vLLM's ``--config`` YAML does. Each
    value is checked as the flag's would be (``parser``: the command's): ``max_concurrency: -1`` started a
    server that answered every request with a 500, ``"8"`` was a traceback."""
    from specdec.tune import read_settings

    actions = {action.dest: action for action in parser._actions if action.option_strings}
    settings = read_settings(args.config)
    if args.command == "export" and "method" in settings and settings["method"] is None and "method" not in typed:
        raise SpecdecError(f"--config {args.config}: tune chose plain decoding there (no method paid on its prompts): "
                           "there is no speculative configuration to export")
    for key, value in settings.items():
        if key not in actions and getattr(args, "config_reads_some", False):
            continue  # export: the engine flags it has, not the execution modes tune also chose
        if key not in actions or not hasattr(args, key):
            raise SpecdecError(f"--config {args.config}: {key!r} is not a setting of `specdec {args.command}`")
        if key == "num_speculative_tokens" and value is None:
            continue  # plain decoding chose no γ: a method typed beside the file runs with the flag's default
        if key == "method" and isinstance(value, str) and key not in typed:  # a typo was an error naming no file
            from specdec.drafters.registry import resolve_method

            try:
                resolve_method(value)
            except SpecdecError as exc:
                raise SpecdecError(f"--config {args.config}: method: {exc}") from None
        if key not in typed:
            setattr(args, key, config_value(actions[key], value, f"--config {args.config}: {key}"))


#: settings a ``--config`` file may set to null where the command's flag has a default: a tune.json that chose plain
#: decoding or suffix decoding says ``"draft_model": null``, and verify and bench (whose default pair has a draft
#: model) refused the file tune told users to pass them
NULLABLE_SETTINGS = frozenset({"draft_model"})


def config_value(action: argparse.Action, value: object, where: str) -> object:
    """A ``--config`` file's value for ``action``'s flag, checked and converted as argparse converts what is typed."""
    if value is None:
        if action.default is not None and action.dest not in NULLABLE_SETTINGS:
            raise SpecdecError(f"{where}: null is not a value of {action.option_strings[0]}")
        return None
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise SpecdecError(f"{where}: expected true or false, got {value!r}")
        return value
    if isinstance(action, argparse._AppendAction):
        if not isinstance(value, list):
            raise SpecdecError(f"{where}: expected a list, got {value!r}")
        return [config_value(argparse.Action(action.option_strings, action.dest, type=action.type, choices=action.choices),
                             item, where) for item in value]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SpecdecError(f"{where}: expected {'a string' if action.type is None else 'a number or a word'}, got {value!r}")
    if action.type is None and not isinstance(value, str):
        raise SpecdecError(f"{where}: expected a string, got {value!r}")
    converted: object = value
    if action.type is not None:
        try:
            converted = action.type(str(value))
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise SpecdecError(f"{where}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        raise SpecdecError(f"{where}: {converted!r} is not one of {', '.join(map(str, action.choices))}")
    return converted


def warn_unread_execution_flags(args: argparse.Namespace, target_mode: str) -> None:
    """``--dtype`` where the target runs a CPU execution mode (the kernels keep their float parts in float32),
    and ``--draft-quantize`` without a draft model: one warning line each — both were silently ignored."""
    from specdec.api import CPU_QUANTIZE_MODES

    # typed, not a command's own default (verify's float32 warned on a bare `specdec verify`)
    typed = getattr(args, "typed_flags", None)
    given = ("dtype" in typed if typed is not None else True) and args.dtype != "auto"
    if given and target_mode in CPU_QUANTIZE_MODES:
        how = "chosen by --quantize auto" if args.quantize == "auto" else "--quantize"
        print(f"warning: --dtype {args.dtype} is not read: the target runs {target_mode} ({how}); add --quantize none "
              f"to run in {args.dtype}", file=sys.stderr)
    if args.draft_quantize is not None and not args.draft_model:
        print(f"warning: --draft-quantize {args.draft_quantize} is not read: there is no --draft-model", file=sys.stderr)


#: where a method's required path comes from (MethodInfo.requires), for the error that names it
REQUIRED_HINTS = {"datastore": "a datastore built with `specdec datastore build`",
                  "drafter_path": "a trained head's directory, written by `specdec train-drafter --kind eagle|medusa`"}


def check_required_options(args: argparse.Namespace, methods: list[str | None]) -> None:
    """Every path the chosen methods require (``MethodInfo.requires``: retrieval's --datastore, eagle's and
    medusa's --drafter-path) given and present — checked before any model loads (the target loaded first,
    seconds to minutes, then the error). ``methods``: registered names; None (plain) requires nothing."""
    from pathlib import Path

    from specdec.drafters.registry import method_info

    flags = {dest: flag for flag, dest in METHOD_FLAGS.items()}
    for method in methods:
        for option in method_info(method).requires if method is not None else ():
            value, flag = getattr(args, option), flags[option]
            if not value:
                raise SpecdecError(f"method {method!r} needs {flag} PATH ({REQUIRED_HINTS.get(option, option)})")
            if not Path(str(value)).expanduser().exists():
                raise SpecdecError(f"{flag} {value}: no such file or folder")


def checked_methods(args: argparse.Namespace, names: list[str], flag: str) -> list[str]:
    """A list of typed method names (bench's and tune's --methods) → the registered names of the speculative ones,
    plain names (``ar``, ``plain``) left out; an unknown name, a draft method without --draft-model or a
    missing required path is refused here, before any model loads (``tune --methods bogus`` failed after it)."""
    from specdec.drafters.registry import needs_draft_model, resolve_method

    methods = []
    for name in names:
        try:
            method = resolve_method(name)
        except SpecdecError as exc:
            raise SpecdecError(f"{flag}: {exc}") from None
        if needs_draft_model(method) and not args.draft_model:
            raise SpecdecError(f"{flag}: method {method!r} needs a draft model: add --draft-model NAME_OR_PATH")
        if method is not None and method not in methods:
            methods.append(method)
    check_required_options(args, methods)
    return methods


def unread_flags(args: argparse.Namespace, method: str | None) -> list[tuple[str, list[str]]]:
    """Method-specific flags set away from their default that ``method`` (a registered name, or None
    for plain decoding) does not read, each with the methods that do (``registry.unread_options``)."""
    from specdec.drafters.registry import unread_options

    flags = {option: flag for flag, option in METHOD_FLAGS.items()}
    return [(flags[option], readers)
            for option, readers in unread_options(method, {option: getattr(args, option) for option in flags})]


def warn_unread_flags(args: argparse.Namespace, method: str | None) -> None:
    """One warning line on stderr per flag the chosen method ignores (not an error: the run goes on)."""
    chosen = f"--method {method}" if method is not None else "plain decoding (no --method)"
    for flag, readers in unread_flags(args, method):
        print(f"warning: {chosen} does not read {flag} (read by: {', '.join(readers) or 'no method'})", file=sys.stderr)
    # (a server's requests may name a method that reads them: only generate's single run is sure)
    if getattr(args, "command", None) == "generate" and method is None and args.num_speculative_tokens is not None:
        print(f"warning: {chosen} drafts nothing: --num-speculative-tokens is not read (add --method or --draft-model)",
              file=sys.stderr)
    if getattr(args, "command", None) == "generate" and args.draft_confidence_threshold is not None:
        from specdec.drafters.registry import method_info, readers_of

        if method is None or "draft_confidence_threshold" not in method_info(method).options:
            readers = ", ".join(readers_of("draft_confidence_threshold"))
            print(f"warning: {chosen} does not read --draft-confidence-threshold (read by: {readers})", file=sys.stderr)
