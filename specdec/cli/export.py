"""``specdec export``: the speculative configuration specdec runs, as the command line of vLLM, SGLang
or llama.cpp's server (:mod:`specdec.exports`), for users who scale out on those engines."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec.cli.common import add_debug_flag, check_output_file
from specdec.cli.values import gamma_value, positive_int
from specdec.config import DEFAULT_DRAFT_METHOD


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    export = subparsers.add_parser(
        "export", help="write a speculative configuration as vLLM / SGLang / llama.cpp flags",
        description="Write the speculative configuration (target, method, draft model, γ) as the command line of "
                    "another engine: vLLM's --speculative-config JSON, SGLang's --speculative-* flags or llama-server's "
                    "-md/--spec-draft-* flags. Where the engine lacks the method, a note says so and names the nearest one.")
    export.add_argument("--engine", required=True, choices=("vllm", "sglang", "llamacpp"), help="the engine to write for")
    export.add_argument("--model", default="qwen2.5-coder-1.5b", help="target: a built-in name or a path (default: qwen2.5-coder-1.5b)")
    export.add_argument("--draft-model", default=None, help="draft model: a built-in name or a path")
    export.add_argument("--method", default=None, help=f"speculative method (default, as generate: {DEFAULT_DRAFT_METHOD} when --draft-model is given)")
    export.add_argument("--num-speculative-tokens", type=gamma_value, default="auto", metavar="N|auto",
                        help="γ, drafted tokens per round: auto (default, as every command) is written as 4 with the "
                             "confidence cut (llama.cpp --spec-draft-p-min; vLLM's suffix decoding: left out, it sizes its "
                             "own drafts); a number drafts all of them every round, as specdec does at a fixed γ")
    export.add_argument("--prompt-lookup-min", type=positive_int, default=1, help="n-gram: shortest match (default: 1)")
    export.add_argument("--prompt-lookup-max", type=positive_int, default=4, help="n-gram: longest match (default: 4)")
    export.add_argument("--draft-confidence-threshold", type=float, default=0.3,
                        help="at γ=auto: end a round below this draft probability (llama.cpp --spec-draft-p-min; default: 0.3)")
    export.add_argument("--out", type=Path, default=None, help="write the command to this file (default: stdout)")
    export.add_argument("--config", default=None, metavar="FILE",
                        help="take the model, draft, method and γ from a file `specdec tune` wrote (or its --out folder); "
                             "flags typed on the command line win")
    add_debug_flag(export)
    export.set_defaults(func=run, config_reads_some=True)
    return export


def check_exported_pair(model: str, draft_model: str) -> None:
    """The pair's tokenizers compared as ``generate`` compares them (a SmolLM2 draft for a Qwen target was written
    out, for the other engine to refuse), where both are on this machine; a name only the other engine's
    machine resolves (an HF repo id) is passed through with a note."""
    from specdec.compat import check_tokenizers
    from specdec.errors import SpecdecError
    from specdec.models.registry import resolve_model
    from specdec.tokenizer import Tokenizer

    paths = []
    for name in (model, draft_model):
        try:
            paths.append(resolve_model(name, auto_pull=False))
        except SpecdecError:
            print(f"note: {name} is not on this machine: the pair's vocabularies were not compared", file=sys.stderr)
            return
    check_tokenizers(Tokenizer.load(paths[0]), Tokenizer.load(paths[1]), model, draft_model)


def run(args: argparse.Namespace) -> int:
    from specdec.config import SpecConfig
    from specdec.drafters.registry import resolve_method
    from specdec.exports import export

    check_output_file(args.out, "--out")
    spec = SpecConfig(method=resolve_method(args.method) if args.method else None,
                      num_speculative_tokens=args.num_speculative_tokens, prompt_lookup_min=args.prompt_lookup_min,
                      prompt_lookup_max=args.prompt_lookup_max, draft_confidence_threshold=args.draft_confidence_threshold)
    if args.draft_model is not None:
        check_exported_pair(args.model, args.draft_model)
    text = export(args.engine, args.model, spec, args.draft_model).render()
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
