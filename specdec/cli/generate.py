"""``specdec generate``: one completion from the command line — the text streams to stdout, the
speculative statistics (acceptance, tokens/s) go to stderr; ``--compare-plain`` also times plain
decoding on the same prompt and checks, under greedy, that the texts are identical."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from specdec.cli.common import (add_debug_flag, add_model_args, add_sampling_args, check_output_file, execution_modes,
                                existing_file, file_or_text, kernels_in_use, pages_in_use, read_text_file,
                                sampling_from_args, spec_from_args)
from specdec.cpu import cpu_description
from specdec.errors import ContextLengthError, SpecdecError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    gen = subparsers.add_parser("generate", help="generate a completion, streaming text to stdout and stats to stderr",
                                description="Generate a completion. Text streams to stdout; statistics go to stderr.")
    gen.add_argument("prompt", nargs="?", default=None,
                     help="prompt text, or - to read it from stdin (a document: --prompt-file)")
    gen.add_argument("--prompt-file", "-f", metavar="FILE", default=None,
                     help="read the prompt from this UTF-8 file instead (llama.cpp's -f): a long document, which a "
                          "command line caps at 128 KB")
    add_model_args(gen)
    add_sampling_args(gen)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt as a user message with the model's chat template")
    gen.add_argument("--system", metavar="FILE_OR_TEXT", default=None,
                     help="a system message before the prompt (a file, or the text itself); implies --chat")
    gen.add_argument("--history", metavar="FILE", default=None,
                     help="earlier turns of the conversation: a JSON file holding a list of OpenAI-style messages "
                          "({\"role\": ..., \"content\": ...}), or an object with a \"messages\" list (a saved chat request) or "
                          "ShareGPT's \"conversations\"; the prompt is the next user message (to reproduce a server conversation's "
                          "turn; \"\" answers a saved request that ends with its user message); implies --chat")
    gen.add_argument("--prediction", metavar="FILE_OR_TEXT", default=None,
                     help="the output expected, largely (OpenAI's Predicted Outputs): a file being edited, an earlier answer "
                          "being revised — a file, or the text itself. The " + ", ".join(prediction_readers()) + " methods draft "
                          "from it; the output is the same with or without it, only faster where it is right")
    gen.add_argument("--suffix", metavar="FILE_OR_TEXT", default=None,
                     help="fill in the middle: the prompt is the code before the insertion point, this the code after it "
                          "(a file, or the text itself); needs a code model with FIM tokens (Qwen2.5-Coder's)")
    gen.add_argument("--compare-plain", action="store_true",
                     help="also run plain decoding on the same prompt and report the speedup (and, under greedy or with --seed, "
                          "whether the texts are identical: they must be)")
    gen.add_argument("--json", action="store_true", help="print the statistics as one JSON object on stderr")
    gen.add_argument("--html", metavar="FILE", default=None,
                     help="write the acceptance view: a self-contained page with every token colored as accepted draft / "
                          "correction / bonus, each round's draft on hover, the accepted-length histogram and α per position")
    gen.add_argument("--explain", action="store_true",
                     help="print how --quantize auto chose: the step-cost curves measured on this CPU and the "
                          "expected tokens/s of each mode")
    add_debug_flag(gen)
    gen.set_defaults(func=run)
    return gen


#: prompts of at least this many tokens are announced before their pass (seconds of silence otherwise)
ANNOUNCED_PROMPT_TOKENS = 512


def announce_prompt_pass(target, prompt: str | list[dict] | list[int], chat: bool) -> float | None:  # noqa: ANN001
    """``prompt pass: 3090 tokens …`` on stderr before a long prompt's pass, whose time the first chunk completes: a
    walkthrough's 3k-token document was 18-50 s with nothing on the screen. The start time, or None (short).
    ``prompt``: text, messages, or token ids (a fill-in-the-middle prompt), counted as the engine encodes them."""
    from specdec.api import encode_prompt

    tokens = len(encode_prompt(target, prompt, chat))
    if tokens < ANNOUNCED_PROMPT_TOKENS:
        return None
    print(f"prompt pass: {tokens} tokens …", end="", file=sys.stderr, flush=True)
    return time.perf_counter()


def prompt_from_args(args: argparse.Namespace) -> str:
    """The prompt: the text, stdin (``-``) or ``--prompt-file`` (``-``: stdin too). A prompt that is the name of an
    existing file is used as text (a walkthrough's document path was completed as a 12-token prompt, unsaid) — with
    a warning."""
    if (args.prompt is None) == (args.prompt_file is None):
        raise SpecdecError("give the prompt as text, - (stdin) or --prompt-file FILE" if args.prompt is None
                           else "give the prompt as text or as --prompt-file, not both")
    if args.prompt == "-" or args.prompt_file == "-":
        return sys.stdin.read()
    if args.prompt_file is not None:
        path = existing_file(args.prompt_file)
        if path is None:
            raise SpecdecError(f"--prompt-file {args.prompt_file}: no such file")
        return read_text_file(path, f"--prompt-file {args.prompt_file}")
    if existing_file(args.prompt) is not None:
        print(f"warning: the prompt is the text {args.prompt!r}, which names a file: to read the file, pass "
              f"--prompt-file {args.prompt}", file=sys.stderr)
    return args.prompt


def prediction_readers() -> list[str]:
    """The registered methods that draft from a predicted output (MethodInfo.reads_prediction)."""
    from specdec.drafters.registry import all_methods

    return [info.name for info in all_methods() if info.reads_prediction]


def run(args: argparse.Namespace) -> int:
    import specdec
    from specdec.drafters.registry import all_methods, method_info

    check_output_file(args.html, "--html")
    prompt: str | list[dict] = prompt_from_args(args)
    if args.suffix is not None and (args.chat or args.system is not None or args.history is not None):
        raise SpecdecError("--suffix fills the middle of a plain prompt: drop --chat/--system/--history")
    suffix = file_or_text(args.suffix, "--suffix") if args.suffix is not None else None  # before minutes of loading
    if prompt == "" and suffix is None and not (args.chat or args.system is not None or args.history is not None):
        raise SpecdecError("the prompt is empty: give at least one token")  # the engine's words, before the model loads
    if args.system is not None or args.history is not None:
        prompt = conversation(prompt, args.system, args.history)
        args.chat = True
    params = sampling_from_args(args)
    spec = spec_from_args(args)
    if args.prediction is not None:
        params = dataclasses.replace(params, prediction=file_or_text(args.prediction, "--prediction"))
        if spec.method is None or not method_info(spec.method).reads_prediction:
            print(f"warning: --prediction is not used by {spec.method or 'plain decoding'} (methods that draft from it: "
                  f"{', '.join(prediction_readers())})", file=sys.stderr)
    if suffix is None:
        check_fits_before_loading(args.model, prompt, args.chat, params.max_tokens, not args.no_pull)
    target_mode, draft_mode, plan = execution_modes(args, spec.method)
    if plan is not None and args.explain:
        print(plan.explain(), file=sys.stderr)
    elif args.explain and target_mode == "auto":  # a GPU: no CPU mode to choose
        from specdec.api import resolve_device

        print("--explain: --quantize auto measures and chooses CPU execution modes; this runs on "
              f"{resolve_device(args.device)}, in float weights", file=sys.stderr)
    elif args.explain:  # it printed nothing: modes a --config file pins (a tune.json does) are not chosen here
        pinned = "the --config file" if args.config and "quantize" not in getattr(args, "typed_flags", set()) else "--quantize"
        print(f"--explain: nothing was chosen here — {pinned} fixed the execution modes (target {target_mode}"
              + (f", draft {draft_mode}" if args.draft_model else "") + "); --quantize auto chooses, and --explain "
              "then prints the measured curves", file=sys.stderr)
    print(f"loading {args.model} …", file=sys.stderr)
    target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=target_mode,
                                  prompt_quantize=args.prompt_quantize)
    draft = None
    if args.draft_model and (spec.method is None or not method_info(spec.method).needs_draft_model):
        readers = ", ".join(info.name for info in all_methods() if info.needs_draft_model)
        print(f"warning: {'--method ' + spec.method if spec.method else 'plain decoding'} does not read --draft-model "
              f"(read by: {readers}); not loaded", file=sys.stderr)
    elif args.draft_model:
        print(f"loading draft {args.draft_model} …", file=sys.stderr)
        draft = specdec.load_model(args.draft_model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=draft_mode,
                                      prompt_quantize=args.prompt_quantize)
    if suffix is not None:
        prompt = target.tokenizer.fill_in_the_middle(prompt, suffix)
    note = " (a quantized model: not the float model's exact outputs)" if target.backend.dtype_name in ("int8", "int4") else ""
    chosen = " (chosen by --quantize auto from step costs measured on this CPU)" if plan is not None and args.quantize == "auto" else ""
    draft_note = f", draft {draft.backend.mode}" if draft is not None else ""  # mode: int4-all where dtype_name says int4
    draft_note += kernels_in_use(target, draft) + pages_in_use(target, draft)
    prompt_modes = [f"{role} {m.backend.prompt_backend.mode}" for role, m in (("target", target), ("draft", draft))
                    if m is not None and m.backend.prompt_backend is not m.backend]
    if prompt_modes:  # a second copy of the weights runs the prompt passes (--prompt-quantize)
        draft_note += f", prompts in {' and '.join(prompt_modes)}"
    print(f"execution: {target.backend.mode}{draft_note} on {target.backend.device} [{cpu_description()}]{chosen}{note}",
          file=sys.stderr)
    if spec.method is not None and plan is not None and args.quantize == "auto" and plan.plain_mode != target.backend.dtype_name:
        # the same command without a drafter gave another text, which read as speculation changing the output
        print(f"note: plain decoding runs this target in {plan.plain_mode} here (cheaper single steps), speculation in "
              f"{target.backend.dtype_name} (cheaper verification): two quantizations of the model, whose greedy texts can "
              f"differ by rounding. Speculation is exact within its mode; --quantize {target.backend.dtype_name} runs plain "
              "decoding the same", file=sys.stderr)
    if args.compare_plain and spec.method is not None:
        warm_up(target, draft, spec, params, args.chat)
    stats = None
    text_parts = []
    token_ids: list[int] = []
    chunks = specdec.stream(target, prompt, params, draft=draft, spec=spec, chat=args.chat)  # (checks the request now)
    reading = announce_prompt_pass(target, prompt, args.chat)
    try:
        for chunk in chunks:
            if reading is not None:  # the pass is over: its time, then the text
                print(f" {time.perf_counter() - reading:.1f} s", file=sys.stderr, flush=True)
                reading = None
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            text_parts.append(chunk.text)
            token_ids.extend(chunk.token_ids)
            stats = chunk.stats or stats
    except BaseException:
        if reading is not None:  # an error or ^C during the pass: on a line of its own
            print(file=sys.stderr, flush=True)
        raise
    sys.stdout.write("\n")
    assert stats is not None
    report = {"stats": stats.to_dict()}
    print(stats.summary_line(), file=sys.stderr)
    if args.html:
        write_view(args.html, target, prompt, args.chat, token_ids, stats)
    if args.compare_plain and spec.method is not None:
        plain_target = target
        if plan is not None and args.quantize == "auto":
            # against our best plain decoding, which may run in another mode than the speculative target
            plain_mode = plan.plain_mode
            if plain_mode != target.backend.dtype_name:
                print(f"loading {args.model} in {plain_mode}, the mode auto picks for plain decoding …", file=sys.stderr)
                plain_target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull,
                                                  progress=True, quantize=plain_mode, prompt_quantize=args.prompt_quantize)
                warm_up(plain_target, None, None, params, args.chat)
        plain = specdec.generate(plain_target, prompt, params, chat=args.chat)
        plain_mode_name, other_mode = plain_target.backend.dtype_name, plain_target is not target
        del plain_target  # the other mode's copy of the weights (GBs) is not needed for the identity check
        speedup = stats.tokens_per_s / plain.stats.tokens_per_s if plain.stats.tokens_per_s else 0.0
        # one mode's text is another's only up to quantization: identity is checked within one mode
        identical = None if other_mode else plain.text == "".join(text_parts)
        print(f"plain decoding: {plain.stats.summary_line()}", file=sys.stderr)
        # end to end too (prompt passes included, as a user waits): a draft model's own prompt pass can make a
        # decode speedup an end-to-end slowdown, and the decode figure alone was printed as "the" speedup
        # as tokens/s: where the modes' texts differ, so can their lengths (one stops at EOS after 28 tokens, the
        # other runs to 128), and a ratio of total times read 4.55x
        plain_rate = plain.stats.generated_tokens / plain.stats.total_time_s if plain.stats.total_time_s else 0.0
        end_to_end = stats.generated_tokens / stats.total_time_s / plain_rate if stats.total_time_s and plain_rate else 0.0
        decode = f"{speedup:.2f}x" if speedup else "n/a (one token: nothing after the first)"
        line = (f"speedup vs plain ({plain_mode_name}): decode {decode} (tokens after the first), "
                f"end to end {end_to_end:.2f}x (tokens/s, prompt passes included)")
        # greedy and seeded output is plain decoding's token for token (specdec/seeded.py): both are checked
        checkable = params.is_greedy or params.is_seeded_sampling
        if checkable and identical is None:
            # a third generation, prompt pass included (minutes on a long prompt): said, not silent
            print(f"checking identity: plain decoding in {target.backend.dtype_name} on the same prompt …", file=sys.stderr)
            check = specdec.generate(target, prompt, params, chat=args.chat)  # same mode, for the identity check
            identical = check.text == "".join(text_parts)
        if checkable:
            line += f" | identical text: {'yes' if identical else 'NO — this is a bug, please report it'}"
            if other_mode:
                line += f" (against plain decoding in {target.backend.dtype_name}, this run's mode"
                line += (f"; the {plain_mode_name} text differs by rounding)" if plain.text != "".join(text_parts)
                         else ")")
        print(line, file=sys.stderr)
        report.update(plain=plain.stats.to_dict(), speedup=round(speedup, 3), end_to_end_speedup=round(end_to_end, 3),
                      identical=identical)
        if checkable and not identical:
            return 3
    if args.json:
        print(json.dumps(report), file=sys.stderr)
    return 0


#: what --compare-plain warms both runs on: not the user's prompt (the prefix cache would then serve its timed
#: prompt pass), and the suffix table is emptied after it
WARM_UP_PROMPT = "Write a short Python function."


#: tokens a chat template may add around a conversation (a default system prompt) and per message
TEMPLATE_TOKENS, TEMPLATE_TOKENS_PER_MESSAGE = 64, 8


def check_fits_before_loading(model: str, prompt: str | list[dict], chat: bool, max_tokens: int, auto_pull: bool) -> None:
    """A prompt checked against the model's context window before the weights load: a 40k-token prompt was refused
    after 18 s and 4.6 GB of loading both models. Counted with the model's tokenizer alone unless its UTF-8 bytes
    plus what a template may add already fit (a byte-level token covers at least one byte), so a short prompt costs
    no tokenizer load; --max-tokens past the context is refused before loading either way."""
    from specdec.engine import check_context
    from specdec.models.registry import resolve_model
    from specdec.models.weights import read_config
    from specdec.tokenizer import Tokenizer

    path = resolve_model(model, auto_pull=auto_pull)
    context = read_config(path).max_position_embeddings
    if max_tokens >= context:
        raise ContextLengthError(f"--max-tokens {max_tokens} leaves no room for the prompt in the model's context "
                                 f"window of {context} tokens; lower --max-tokens")
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    text = prompt if isinstance(prompt, str) else "".join(str(message.get("content") or "") for message in prompt)
    token_bound = len(text.encode(errors="replace")) + TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)
    if token_bound + max_tokens <= context:  # (not UTF-8: refused by name after loading)
        return
    check_context(prompt_tokens(Tokenizer.load(path), prompt, chat), max_tokens, context)


def prompt_tokens(tokenizer, prompt: str | list[dict], chat: bool) -> int:  # noqa: ANN001 - specdec.tokenizer.Tokenizer
    """Tokens of ``prompt`` as generate feeds it: messages (or a chat prompt) through the chat template, else the text."""
    if isinstance(prompt, list) or chat:
        return len(tokenizer.apply_chat_template(prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]))
    return len(tokenizer.encode(prompt))


def fitting_rows(rows: list, model: str, max_tokens: int, auto_pull: bool, source: str, wanted: int | None = None) -> list:
    """The dataset rows (PromptRow) whose every turn fits the model's context with ``max_tokens``, each one that does
    not named in a warning line: a 40k-token row ended tune, bench and verify after their first measurements (verify
    printed it as a failed losslessness check). A chat row's last turn carries the earlier turns and their answers,
    counted as ``max_tokens`` each. Rows short enough in bytes (a token is at least one) are kept untokenized; the
    others are counted with the tokenizer alone, before the weights load. ``wanted``: stop once that many fit."""
    from specdec.models.registry import resolve_model
    from specdec.models.weights import read_config

    path = resolve_model(model, auto_pull=auto_pull)
    context = read_config(path).max_position_embeddings
    tokenizer = None
    kept = []
    for row in rows:
        if wanted is not None and len(kept) >= wanted:
            break
        earlier_answers = (len(row.turns) - 1) * max_tokens if row.chat else 0
        texts = [str(message.get("content") or "") for message in row.history] + list(row.turns) if row.chat else row.turns
        messages = len(row.history) + 2 * len(row.turns)
        bound = (sum(len(text.encode(errors="replace")) for text in texts) + TEMPLATE_TOKENS
                 + TEMPLATE_TOKENS_PER_MESSAGE * messages + earlier_answers + max_tokens)
        if bound > context:
            if tokenizer is None:
                from specdec.tokenizer import Tokenizer

                tokenizer = Tokenizer.load(path)
            if row.chat:
                placeholder = [{"role": "assistant", "content": ""}]
                conversation = list(row.history)
                for turn in row.turns:
                    conversation += [{"role": "user", "content": turn}, *placeholder]
                prompt = prompt_tokens(tokenizer, conversation[:-1], chat=True)
            else:
                prompt = max(prompt_tokens(tokenizer, turn, chat=False) for turn in row.turns)
            if prompt + earlier_answers + max_tokens > context:
                turns = (f"its {len(row.turns)} turns ({prompt} tokens of messages, each earlier answer counted as "
                         f"max_tokens {max_tokens})" if earlier_answers else f"prompt ({prompt} tokens)")
                print(f"warning: skipped {source} row {row.id}: {turns} + max_tokens ({max_tokens}) exceed the model's "
                      f"context window of {context} tokens", file=sys.stderr)
                continue
        kept.append(row)
    return kept


def conversation(prompt: str, system: str | None, history: str | None) -> list[dict]:
    """``--system`` and ``--history`` around the prompt: [system] + earlier turns + the prompt as the next user
    message. A history file is checked here (a wrong one was otherwise found after the models loaded)."""
    messages: list[dict] = []
    if system is not None:
        messages.append({"role": "system", "content": file_or_text(system, "--system")})
    if history is not None:
        messages += read_history(history)
    if prompt == "":  # a saved request that ends with its user message: answer it as it stands
        if not messages or messages[-1]["role"] != "user":
            raise SpecdecError("the prompt is empty: give the next user message (an empty prompt answers a --history "
                               "that ends with a user message)")
        return messages
    return messages + [{"role": "user", "content": prompt}]


def read_history(path: str) -> list[dict]:
    """The messages of a ``--history`` file: a JSON list of messages, a chat request's ``{"messages": [...]}`` or a
    ShareGPT row's ``{"conversations": [...]}`` — checked as tune's logged prompts are (a null content or a mistyped
    role failed after the model loaded, as a chat-template error)."""
    from pathlib import Path

    from specdec.bench.datasets import chat_messages

    try:
        loaded = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecdecError(f"--history {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecdecError(f"--history {path}: not a JSON file of chat messages ({exc})") from None
    messages = chat_messages({"messages": loaded} if isinstance(loaded, list) else loaded if isinstance(loaded, dict) else {},
                             f"--history {path}")
    if messages is None:
        raise SpecdecError(f"--history {path}: expected a list of messages, or an object with a \"messages\" (an OpenAI chat "
                           "request) or \"conversations\" (ShareGPT) list")
    return messages


def warm_up(target, draft, spec, params, chat: bool) -> None:  # noqa: ANN001
    """A few tokens through speculative decoding (and plain) before --compare-plain times them: a process's
    first generation pays one-time costs (weights first read, kernel paths first taken) — on the AMX Xeon the
    first speculative run decoded at 10.6 tok/s and the next at 18.6-21.0 on the same prompt, so the speedup
    compared a cold run with a warm one."""
    import specdec
    from specdec.drafters.suffix import clear_global_caches

    short = dataclasses.replace(params, max_tokens=min(8, params.max_tokens), stop=[], stop_token_ids=[], structured=None,
                                prediction=None, min_tokens=0)
    if spec is not None:
        specdec.generate(target, WARM_UP_PROMPT, short, draft=draft, spec=spec, chat=chat)
    specdec.generate(target, WARM_UP_PROMPT, short, chat=chat)
    clear_global_caches()


def write_view(path: str, target, prompt: str | list[int] | list[dict], chat: bool, token_ids: list[int], stats) -> None:  # noqa: ANN001
    """``--html``: the acceptance view of this generation (the prompt shown as the model saw it)."""
    from pathlib import Path

    from specdec.acceptance_view import render

    if chat:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        shown = target.tokenizer.render_chat(messages)
    else:  # a fill-in-the-middle prompt is token ids, its markers shown
        shown = prompt if isinstance(prompt, str) else target.tokenizer.decode(prompt, skip_special_tokens=False)
    Path(path).write_text(render(target.tokenizer, shown, token_ids, stats, title=f"specdec · {target.name}"), encoding="utf-8")
    print(f"acceptance view: {path}", file=sys.stderr)
