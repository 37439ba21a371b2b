"""Draft-model speculative decoding vs plain decoding on HumanEval, with transformers' assisted
generation as the peer — all in one run, same prompts, interleaved per prompt, median of repeats.

    .venv/bin/python benchmarks/speculative.py --prompts 5 --max-tokens 128 --gammas 2,4,6,8,auto --repeats 3

Prints a markdown table per temperature: tokens/s, speedup vs our plain decoding, α, τ, and where the
time goes (draft / verify / other), plus whether greedy outputs were identical to plain decoding.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.models.registry import resolve_model  # noqa: E402
from specdec.drafters.suffix import clear_global_caches  # noqa: E402


def hf_tokens_per_s(target, assistant, ids: list[int], max_tokens: int, temperature: float) -> float:
    """transformers generate() tokens/s (prefill included, as a user sees it)."""
    kwargs = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=0, eos_token_id=None,
                  do_sample=temperature > 0)
    if temperature > 0:
        kwargs["temperature"] = temperature
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    with torch.inference_mode():
        start = time.perf_counter()
        target.generate(torch.tensor([ids]), **kwargs)
    return max_tokens / (time.perf_counter() - start)


def cost_model(stats: list, plain_step_s: float) -> tuple[float, float, str]:
    """Where the speedup is bounded: c₁ = draft seconds per drafted token and v = verify seconds per
    round, both in units of one plain decode step, and the acceptance rate α at which this γ and these
    costs would give 1.5× (expected tokens per round ÷ (γ·c₁ + v) = 1.5; "> 1" if none can)."""
    from specdec.adaptive import expected_tokens

    c1 = statistics.median(s.draft_time_s / max(s.proposed_tokens, 1) for s in stats) / plain_step_s
    v = statistics.median(s.verify_time_s / max(s.target_forwards, 1) for s in stats) / plain_step_s
    gamma = round(statistics.median(s.proposed_tokens / max(s.target_forwards, 1) for s in stats))
    need = next((a / 100 for a in range(101) if expected_tokens(a / 100, gamma) >= 1.5 * (gamma * c1 + v)), None)
    return c1, v, "> 1" if need is None else f"{need:.2f}"


def _split_config(config: str) -> tuple[str, bool, str]:
    """"G[@P][+suffix][:N]" (see --gammas) → ("G[@P]", suffix-assisted?, "N" or "")."""
    head, _, vocab = config.partition(":")
    return head.replace("+suffix", ""), "+suffix" in head, vocab


def spec_for_config(config: str) -> specdec.SpecConfig:
    head, suffix_assisted, vocab = _split_config(config)
    gamma, _, threshold = head.partition("@")
    return specdec.SpecConfig(method="draft_suffix" if suffix_assisted else "draft_model",
                              num_speculative_tokens=gamma if gamma == "auto" else int(gamma),
                              draft_vocab_size=int(vocab or 0),
                              **({"draft_confidence_threshold": float(threshold)} if threshold else {}))


def config_label(config: str) -> str:
    head, suffix_assisted, vocab = _split_config(config)
    return ("draft+suffix" if suffix_assisted else "draft") + f" γ={head}" + (f", draft vocab {vocab}" if vocab else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--quantize", default="int8", choices=["int8", "int4", "int4-all", "none"])
    parser.add_argument("--draft-quantize", default=None, choices=["int8", "int4", "int4-all", "none"], help="the draft's execution (default: --quantize)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--gammas", default="2,4,6,8,auto", help="γ values; G:N also limits the draft to N token ids (--draft-vocab-size); auto@P sets --draft-confidence-threshold P; "
                        "G+suffix runs method draft_suffix (the suffix table drafts where it is confident, the draft model elsewhere)")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peer", choices=["hf", "none"], default="hf", help="transformers plain + assisted generation (fp32), once per prompt")
    args = parser.parse_args()

    target = specdec.load_model(args.model, args.dtype, "cpu", quantize=args.quantize)
    draft = specdec.load_model(args.draft_model, args.dtype, "cpu", quantize=args.draft_quantize or args.quantize)
    rows = load_prompts("humaneval", limit=args.prompts)
    prompts = [target.tokenizer.encode(r.turns[0]) for r in rows]
    gammas: list[str] = args.gammas.split(",")  # "4", "auto", or "4:32768" = γ 4 with a 32768-token draft vocabulary
    hf_target = hf_draft = None
    if args.peer == "hf":
        from transformers import AutoModelForCausalLM

        def load_hf(name: str):
            path = resolve_model(name)
            return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

        hf_target, hf_draft = load_hf(args.model), load_hf(args.draft_model)

    print(f"# {args.model} ← {args.draft_model}, execution {target.backend.dtype_name} (draft {args.draft_quantize or args.quantize}), {torch.get_num_threads()} threads, "
          f"{len(prompts)} HumanEval prompts × {args.max_tokens} tokens, median of {args.repeats}, methods interleaved per prompt")
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        configs = ["plain", *gammas]
        results: dict[str, list[specdec.Stats]] = {str(c): [] for c in configs}
        identical = {str(c): True for c in configs}
        hf_plain, hf_assisted = [], []
        for prompt_index, ids in enumerate(prompts):
            params = specdec.SamplingParams(temperature=temperature, max_tokens=args.max_tokens, ignore_eos=True, seed=prompt_index)
            plain_tokens = None
            for _ in range(args.repeats):
                for config in configs:
                    if config == "plain":
                        out = specdec.generate(target, ids, params)
                        plain_tokens = out.token_ids
                    else:
                        clear_global_caches()  # a repeat must not draft from its own earlier output
                        out = specdec.generate(target, ids, params, draft=draft, spec=spec_for_config(config))
                        if temperature == 0 and out.token_ids != plain_tokens:
                            identical[str(config)] = False
                    results[str(config)].append(out.stats)
            if hf_target is not None and temperature == 0:  # the peer once per prompt, greedy
                hf_plain.append(hf_tokens_per_s(hf_target, None, ids, args.max_tokens, temperature))
                hf_assisted.append(hf_tokens_per_s(hf_target, hf_draft, ids, args.max_tokens, temperature))
            print(f"  prompt {prompt_index + 1}/{len(prompts)} done", file=sys.stderr, flush=True)

        plain_tps = statistics.median(s.tokens_per_s for s in results["plain"])
        plain_step_s = statistics.median(s.verify_time_s / max(s.target_forwards, 1) for s in results["plain"])
        print(f"\n## temperature {temperature:g}\n")
        print("| config | tok/s | speedup vs plain | α | τ | draft s | verify s | other s | c₁ | v | α for 1.5× | GB/s | identical to plain |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for config in configs:
            stats = results[str(config)]
            tps = statistics.median(s.tokens_per_s for s in stats)
            alpha = statistics.median(s.acceptance_rate for s in stats)
            tau = statistics.median(s.mean_accepted_len for s in stats)
            draft_s, verify_s, other_s = (statistics.median(getattr(s, f) for s in stats) for f in ("draft_time_s", "verify_time_s", "overhead_time_s"))
            gbs = statistics.median(s.achieved_gb_per_s for s in stats)
            same = "n/a (sampling)" if temperature > 0 else ("yes" if identical[str(config)] else "**NO**")
            name = "plain (ours)" if config == "plain" else config_label(config)
            cost = "| – | – | – " if config == "plain" else "| {:.2f} | {:.2f} | {} ".format(*cost_model(stats, plain_step_s))
            print(f"| {name} | {tps:.2f} | {tps / plain_tps:.2f}× | {alpha:.2f} | {tau:.2f} | {draft_s:.2f} | {verify_s:.2f} | {other_s:.2f} "
                  f"{cost}| {gbs:.1f} | {same} |")
        if hf_plain:
            p, a = statistics.median(hf_plain), statistics.median(hf_assisted)
            print(f"| transformers plain (fp32) | {p:.2f} | {p / plain_tps:.2f}× | | | | | | | |")
            print(f"| transformers assisted (fp32) | {a:.2f} | {a / plain_tps:.2f}× | | | | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
