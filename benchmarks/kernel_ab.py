"""Did a kernel change make the model faster? This tree's C++ kernels against a git revision's, on the
whole quantized model, in one process, forward for forward.

Why one process: on a shared 2-core machine two runs minutes apart differ by more than most kernel
changes (a 1.5B int4 step measured 30–42 ms within the same hour), and two processes started one after
the other place their weights differently. Here both builds are loaded side by side (``--base``'s
sources are built as a second extension module), each holds its own copy of the model, and their
forwards alternate (which goes first alternates too). Loading order itself moved results by ~5 %, so
by default the whole comparison runs twice, each build loaded first once, and the table reports both
and their mean. Each cell: median ms of ``--repeats`` forwards of T new tokens after ``--context``
cached ones (the cache rolled back each time), as a speculative verification step sees it.

    .venv/bin/python benchmarks/kernel_ab.py                       # this tree vs HEAD, int4 1.5B
    .venv/bin/python benchmarks/kernel_ab.py --base HEAD~3 --tokens 1,2,4 --quantize int4-all \\
        --model qwen2.5-coder-0.5b

Outputs are not compared (a kernel change may change bits); tests/test_kernel_paths.py checks this
tree's own exactness.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec.backends.torch_backend import TorchBackend  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.kernels import build  # noqa: E402
from specdec.paths import specdec_home  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def base_kernels(revision: str) -> object:
    """``revision``'s kernel sources, built once per commit as the module ``specdec_base_kernels``."""
    found = subprocess.run(["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=REPO, capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"--base {revision}: not a commit of this repository ({found.stderr.strip()})")
    commit = found.stdout.strip()
    directory = specdec_home() / "ext" / f"kernel-ab-{commit[:12]}"
    directory.mkdir(parents=True, exist_ok=True)
    for path in build.SOURCES + build.HEADERS:
        relative = path.relative_to(REPO).as_posix()
        shown = subprocess.run(["git", "show", f"{commit}:{relative}"], cwd=REPO, capture_output=True)
        if shown.returncode != 0:  # a file added after that revision
            continue
        source = shown.stdout
        target = directory / path.name
        if not target.exists() or target.read_bytes() != source:
            target.write_bytes(source)
    print(f"# base: {revision} = {commit[:12]} (its kernels built in {directory})", file=sys.stderr)
    return build.build_from(directory, "specdec_base_kernels")


def load(model: str, quantize: str, kernels: object | None) -> TorchBackend:
    """``model`` with ``kernels`` (None: this tree's build)."""
    with build.layers_built_with(kernels) if kernels is not None else contextlib.nullcontext():
        return specdec.load_model(model, "auto", "cpu", quantize=quantize).backend


def compare(backends: dict[str, TorchBackend], tokens: list[int], context: int, repeats: int) -> dict[tuple[str, int], float]:
    """Median seconds per (build, T): the builds' forwards alternate, the first one alternating too."""
    vocab = next(iter(backends.values())).config.vocab_size
    ids = torch.randint(0, vocab, (context + max(tokens),), generator=torch.Generator().manual_seed(0)).tolist()
    states = {}
    for name, backend in backends.items():
        states[name] = backend.new_state(context + max(tokens) + 1)
        backend.forward(states[name], ids[:context], num_logits=1)
    times: dict[tuple[str, int], list[float]] = {}
    names = list(backends)
    for repeat in range(repeats + 1):  # the first round warms up
        for size in tokens:
            for name in names if repeat % 2 == 0 else names[::-1]:
                states[name].truncate(context)
                start = time.perf_counter()
                backends[name].forward(states[name], ids[context : context + size])
                if repeat:
                    times.setdefault((name, size), []).append(time.perf_counter() - start)
    return {key: statistics.median(samples) for key, samples in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="git revision whose kernels to compare against (default: HEAD)")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="built-in name, GGUF file or HF directory")
    parser.add_argument("--quantize", default="int4",
                        help="int4, int4-all or int8 (int8's GEMM is this tree's in both models: the A/B then "
                             "compares the layer glue, attention included)")
    parser.add_argument("--tokens", default="1,2,3,4,5,8", help="new tokens per forward (a verification step's rows)")
    parser.add_argument("--context", type=int, default=256, help="tokens already in the cache")
    parser.add_argument("--repeats", type=int, default=15, help="timed forwards per build, size and load order")
    parser.add_argument("--orders", choices=("both", "one"), default="both",
                        help="both: run twice, each build loaded first once (load order moved results ~5 %%)")
    args = parser.parse_args()
    if args.quantize not in ("int4", "int4-all", "int8"):
        raise SystemExit(f"--quantize {args.quantize}: the C++ kernels run int4, int4-all and int8")
    tokens = [int(t) for t in args.tokens.split(",")]
    base = base_kernels(args.base)
    runs = []
    weight_bytes = 0
    for order in (("base", "tree"), ("tree", "base"))[: 2 if args.orders == "both" else 1]:
        backends = {name: load(args.model, args.quantize, base if name == "base" else None) for name in order}
        weight_bytes = backends["tree"].weight_bytes
        runs.append(compare(backends, tokens, args.context, args.repeats))
        del backends
    print(f"# {args.model} {args.quantize}, this tree's kernels vs {args.base}'s; CPU: {cpu_description()}; "
          f"{torch.get_num_threads()} threads; context {args.context}; median of {args.repeats}"
          + ("; each build loaded first once" if len(runs) == 2 else ""))
    header = "| T | " + " | ".join(f"base ms ({i + 1}) | tree ms ({i + 1}) | tree ÷ base ({i + 1})" for i in range(len(runs)))
    print(header + (" | mean tree ÷ base |" if len(runs) == 2 else " |"))
    print("|---" * (1 + 3 * len(runs) + (len(runs) == 2)) + "|")
    for size in tokens:
        ratios = [run[("tree", size)] / run[("base", size)] for run in runs]
        cells = " | ".join(f"{run[('base', size)] * 1e3:.2f} | {run[('tree', size)] * 1e3:.2f} | {ratio:.3f}"
                           for run, ratio in zip(runs, ratios))
        mean = f" | **{statistics.fmean(ratios):.3f}**" if len(runs) == 2 else ""
        print(f"| {size} | {cells}{mean} |", flush=True)
    one = min((run[("tree", tokens[0])] for run in runs))
    print(f"\nweights {weight_bytes / 1e9:.2f} GB per forward: this tree's fastest {tokens[0]}-token forward "
          f"{one * 1e3:.1f} ms = {weight_bytes / one / 1e9:.0f} GB/s")


if __name__ == "__main__":
    main()
