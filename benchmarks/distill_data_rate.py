"""Self-distillation data per CPU minute: training rows (tokens with the target's features) made by
generating and then re-reading the continuations (teacher-forced extraction, sessions 28–29) against
recording the features while generating (``specdec.train.generated.continue_greedily``), on the same
prompts in one run (issue 23: the EAGLE head is data-limited at its 2-hour budget).

    .venv/bin/python benchmarks/distill_data_rate.py --prompts 32 --concurrency 8,16,32

Prompts: the first ``--prompts`` of the standard library's function prompts (the ones
``train-drafter --generate-minutes`` continues), ``--new-tokens`` each. "generate + extract" is the
old path: ``generate_batch`` at concurrency 8 (its default then), then one teacher-forced prefill of
each sequence's last ``--seq-len`` tokens. Prints minutes and training rows per minute per way, the
machine's CPU flags, and checks that both ways generated the same tokens (greedy, bit-identical
batching on the int8 CPU path). Rows: the old way keeps each sequence's last token, the new one
only fed tokens (the last generated token never is), so a short sequence has one row fewer.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import specdec  # noqa: E402
from specdec.batch import generate_batch  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.train.data import stdlib_documents, teacher_forced  # noqa: E402
from specdec.train.generated import continue_greedily, prompt_ids  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--quantize", default="int8")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--concurrency", default="8,16,32", help="concurrencies of the recording way")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the old way (generate, then extract): compare concurrencies only")
    args = parser.parse_args()
    target = specdec.load_model(args.model, quantize=args.quantize)
    pairs = prompt_ids(stdlib_documents(), target.tokenizer.encode, held_out=False)[: args.prompts]
    prompts = [ids for _, ids in pairs]
    print(f"# {args.model} {args.quantize}, {torch.get_num_threads()} threads, CPU {cpu_description()}; "
          f"{len(prompts)} stdlib function prompts ({sum(map(len, prompts))} tokens), {args.new_tokens} new tokens each")
    print("| way | concurrency | generate min | extract min | training rows | rows per minute | × generate + extract |")
    print("|---|---|---|---|---|---|---|")
    params = specdec.SamplingParams(max_tokens=args.new_tokens, temperature=0.0)
    results, old_rate = None, None
    if not args.no_baseline:
        start = time.perf_counter()
        results = generate_batch(target, prompts, params, max_num_seqs=8)
        generated = time.perf_counter() - start
        sequences = [(ids + r.token_ids)[-args.seq_len:] for ids, r in zip(prompts, results)]
        start = time.perf_counter()
        for seq in sequences:
            teacher_forced(target.backend, seq)
        extracted = time.perf_counter() - start
        old_rows = sum(map(len, sequences))
        old_rate = old_rows / ((generated + extracted) / 60)
        print(f"| generate + extract | 8 | {generated / 60:.2f} | {extracted / 60:.2f} | {old_rows} | {old_rate:.0f} | 1.00 |")
    first: dict[int, list[int]] | None = None  # the first concurrency's continuations: every other must equal them
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        start = time.perf_counter()
        made = list(continue_greedily(target.backend, prompts, args.new_tokens, concurrency,
                                      target.tokenizer.stop_token_ids, args.seq_len))
        seconds = time.perf_counter() - start
        rows = sum(min(args.seq_len, len(c.tokens) - 1) for c in made)
        stops = target.tokenizer.stop_token_ids  # generate_batch leaves a stop token out; a training row keeps it
        if results is not None:
            same = all([t for t in c.tokens[len(prompts[c.index]):] if t not in stops] == results[c.index].token_ids
                       for c in made)
        else:
            tokens = {c.index: c.tokens for c in made}
            first = first if first is not None else tokens
            same = tokens == first
        ratio = f"{rows / (seconds / 60) / old_rate:.2f}" if old_rate else "–"
        print(f"| record while generating | {concurrency} | {seconds / 60:.2f} | 0 | {rows} | {rows / (seconds / 60):.0f} | "
              f"{ratio} |" + ("" if same else " (tokens differ!)"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
