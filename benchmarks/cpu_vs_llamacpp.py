"""specdec vs llama.cpp on the same CPU, same GGUF files, same prompt token ids, same run.

llama.cpp is a peer only: its ``llama-server`` (built from the ``llama-cpp-python`` sdist's bundled
source, see ``specdec/bench/llamacpp.py``) runs as a subprocess and is sent the token ids we decode.

    .venv/bin/python benchmarks/cpu_vs_llamacpp.py --llama-bin /tmp/llamacpp-build/bin --prompts 2 --max-tokens 96

Per prompt (HumanEval raw completions; Spec-Bench summarization and rag through the chat template),
interleaved, median of ``--repeats``, greedy, fixed length (EOS ignored): llama.cpp plain and with
the draft model (its speculative mode, on the GGUF's own quantization), ours plain and speculative
(draft model, ngram, suffix) in each ``--quantize`` mode (int8, int4). Decode tokens/s as each engine measures it (prefill excluded on
both sides), α where there is a drafter, and whether llama.cpp's greedy text equals ours (our int4
runs the GGUF's own Q4_K blocks, so it can match llama.cpp token for token; int8 requantizes them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec.api import encode_prompt  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.bench.llamacpp import llamacpp_peers  # noqa: E402
from specdec.drafters.registry import needs_draft_model, resolve_method  # noqa: E402
from specdec.drafters.suffix import clear_global_caches  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-bin", default="/tmp/llamacpp-build/bin", help="directory with llama.cpp's llama-server (build: see specdec/bench/llamacpp.py)")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--prompts", type=int, default=2, help="per group (HumanEval, summarization, rag)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quantize", default="int8,int4", help="our target's execution modes, comma-separated")
    parser.add_argument("--draft-quantize", default="int4-all", help="our draft model's execution (int4-all: every layer, LM head included, in 4 bits)")
    parser.add_argument("--methods", default="draft,ngram,suffix", help="our speculative methods (besides plain); draft:N limits the draft to N token ids")
    args = parser.parse_args()
    modes = args.quantize.split(",")
    targets = {mode: specdec.load_model(args.model, "float32", "cpu", quantize=mode) for mode in modes}
    target = targets[modes[0]]
    draft = specdec.load_model(args.draft_model, "float32", "cpu", quantize=args.draft_quantize)
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llama, close = llamacpp_peers(args.llama_bin, target.path, draft.path, params, args.gamma, args.threads)
    rows = load_prompts("humaneval", limit=args.prompts)
    rows += load_prompts("spec_bench", categories=["summarization", "rag"], limit=args.prompts)
    ours: dict[str, tuple[str, specdec.SpecConfig]] = {}
    for mode in modes:
        ours[f"ours plain ({mode})"] = (mode, specdec.SpecConfig())
        for method in args.methods.split(","):
            method, _, vocab = method.partition(":")  # draft:32768 = a reduced draft vocabulary
            label = f"ours {method} γ={args.gamma}{f' vocab {vocab}' if vocab else ''} ({mode})"
            ours[label] = (mode, specdec.SpecConfig(method=resolve_method(method), num_speculative_tokens=args.gamma,
                                                     draft_vocab_size=int(vocab or 0)))
    llama_names = {"llama.cpp plain": "llamacpp", f"llama.cpp draft γ={args.gamma}": "llamacpp-draft"}
    plain_names = [f"ours plain ({mode})" for mode in modes]
    names = [*plain_names, *llama_names, *[n for n in ours if n not in plain_names]]
    groups = sorted({"humaneval" if not r.chat else r.category for r in rows})
    rates: dict[tuple[str, str], list[float]] = {}
    alphas: dict[tuple[str, str], list[float]] = {}
    same_as_ours = {(name, mode): 0 for name in llama_names for mode in modes}  # greedy runs equal to our plain output
    print(f"# {args.model} ← {args.draft_model}; llama.cpp on the GGUF's own quantization, ours {args.quantize} "
          f"(draft {args.draft_quantize}); {args.threads} threads; "
          f"{len(rows)} prompts × {args.max_tokens} tokens, greedy, median of {args.repeats}, interleaved per prompt")
    try:
        for index, row in enumerate(rows):
            group = "humaneval" if not row.chat else row.category
            ids = encode_prompt(target, row.turns[0], chat=row.chat)
            for _ in range(args.repeats):
                plain_tokens: dict[str, list[int]] = {}
                for name in names:
                    if name in llama_names:
                        tokens, stats, _ = llama[llama_names[name]](ids)
                        rate, alpha = stats["tokens_per_s"], (stats["acceptance_rate"] if stats["proposed_tokens"] else None)
                        for mode in modes:
                            same_as_ours[(name, mode)] += int(tokens == plain_tokens[mode])
                    else:
                        mode, spec = ours[name]
                        clear_global_caches()  # suffix: never draft from an earlier run of this prompt
                        out = specdec.generate(targets[mode], ids, params, spec=spec,
                                               draft=draft if needs_draft_model(spec.method) else None)
                        tokens, rate = out.token_ids, out.stats.tokens_per_s
                        alpha = out.stats.acceptance_rate if spec.method else None
                        if spec.method is None:
                            plain_tokens[mode] = tokens
                    rates.setdefault((group, name), []).append(rate)
                    if alpha is not None:
                        alphas.setdefault((group, name), []).append(alpha)
            print(f"  prompt {index + 1}/{len(rows)} done", file=sys.stderr, flush=True)
    finally:
        close()

    print(f"\n| group | engine / method | tok/s | vs llama.cpp plain | vs {plain_names[0]} | α |")
    print("|---|---|---|---|---|---|")
    for group in groups:
        base_llama = statistics.median(rates[(group, "llama.cpp plain")])
        base_ours = statistics.median(rates[(group, plain_names[0])])
        for name in names:
            rate = statistics.median(rates[(group, name)])
            alpha = f"{statistics.median(alphas[(group, name)]):.2f}" if (group, name) in alphas else ""
            print(f"| {group} | {name} | {rate:.2f} | {rate / base_llama:.2f}× | {rate / base_ours:.2f}× | {alpha} |")
    runs = len(rows) * args.repeats
    print("\n" + "; ".join(f"{name}: {count}/{runs} greedy outputs equal ours ({mode})"
                             for (name, mode), count in same_as_ours.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
