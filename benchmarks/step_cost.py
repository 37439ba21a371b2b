"""What a verification step costs as it grows: target forward time for T = 1, 2, 4, 8, 16 tokens.

Speculation pays when verifying k+1 tokens costs little more than decoding one; this prints that
curve for a model on a device, in an execution mode, at a context length — the numbers the γ
cost model (`specdec/adaptive.py`) learns online, measured offline so a user can see them before
choosing a drafter and γ. Each cell is the median of ``--repeats`` forwards (synchronised on CUDA)
after a warm-up, at the same cache position; GB/s is weight bytes per step / step time.

    .venv/bin/python benchmarks/step_cost.py --model qwen2.5-coder-1.5b --quantize int4 --context 512
    python benchmarks/step_cost.py --shape qwen2.5-1.5b --device cuda --dtype bfloat16   # random weights

``--shape`` builds a randomly initialised model of a known architecture (no weights needed: step
cost depends on shapes, not values), for machines without the weight packages, such as a lent GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import torch

import specdec
import specdec.api
from specdec.backends.torch_backend import TorchBackend
from specdec.cpu import cpu_flags
from specdec.kernels.build import kernel
from specdec.models.config import ModelConfig
from specdec.models.transformer import Decoder
from specdec.tree import TreeLayout

SHAPES: dict[str, ModelConfig] = {  # the built-in Qwen2.5-Coder pair (../shared/models.md)
    "qwen2.5-1.5b": ModelConfig(arch="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                                num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128,
                                max_position_embeddings=32768, rope_theta=1e6, attention_bias=True),
    "qwen2.5-0.5b": ModelConfig(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                                max_position_embeddings=32768, rope_theta=1e6, attention_bias=True),
}


def random_backend(shape: str, dtype: torch.dtype, device: str) -> TorchBackend:
    """A model of ``shape``'s architecture with small random weights (built directly on ``device``)."""
    with torch.device(device):
        decoder = Decoder(SHAPES[shape]).to(dtype)
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            param.copy_(torch.ones_like(param) if "norm" in name else 0.02 * torch.randn_like(param))
    return TorchBackend(decoder.eval())


def binary_tree(size: int, base: int) -> TreeLayout:
    """A tree region of ``size`` slots from ``base``: the last committed token, then nodes in a binary
    tree under it (depth ~log2 T: the widest shape a verification step sees)."""
    return TreeLayout(base, [-1] + [(node - 1) // 2 for node in range(1, size)])


def time_steps(backend: TorchBackend, context: list[int], new: list[int], repeats: int,
               paths: list[str | None], tree: bool = False) -> dict[str | None, float]:
    """Median seconds of one forward of the ``new`` tokens after ``context`` (cache rolled back each
    time; ``tree``: as a binary token tree, tree attention), per kernel path; the paths take turns
    at every repeat, so drift hits them alike."""
    layout = binary_tree(len(new), len(context)) if tree else None
    state = backend.new_state(len(context) + len(new) + 1)
    backend.forward(state, context, num_logits=1)
    times: dict[str | None, list[float]] = {path: [] for path in paths}
    for _ in range(repeats + 1):  # the first round is a warm-up
        for path in paths:
            if path is not None:
                kernel().set_kernel_path(path)
            state.truncate(len(context))
            backend.synchronize()
            start = time.perf_counter()
            backend.forward(state, new, tree=layout)
            backend.synchronize()
            times[path].append(time.perf_counter() - start)
    return {path: statistics.median(samples[1:]) for path, samples in times.items()}


def time_heads(backend: TorchBackend, context: list[int], gamma: int, repeats: int) -> dict[str, float]:
    """Median seconds of one drafting round of γ tokens by an untrained EAGLE head and by Medusa
    heads of the target's shape (the drafters' own ``propose``, greedy), after ``context``. EAGLE's
    round reads one newly committed position, as in steady decoding, then drafts on its own features.
    Also the target's 1-token step while its cache records features for the head (CUDA: a graph)."""
    from specdec.drafters.eagle import EagleDrafter
    from specdec.drafters.medusa import MedusaDrafter
    from specdec.models.heads import HeadConfig, new_head
    from specdec.sampling import SamplingParams, make_generator

    def median_seconds(run: Callable[[], object], before: Callable[[], object]) -> float:
        """Median over ``repeats`` (after a warm-up) of ``run``'s synchronised time, ``before`` untimed."""
        samples = []
        for _ in range(repeats + 1):
            before()
            backend.synchronize()
            start = time.perf_counter()
            run()
            backend.synchronize()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples[1:])

    params = SamplingParams(temperature=0.0)
    result = {}
    for kind in ("eagle", "medusa"):
        head = new_head(HeadConfig.for_target(backend.config, kind=kind, num_medusa_heads=gamma)).to(backend.device).eval()
        drafter = (EagleDrafter(head, backend, params, make_generator(0), len(context) + gamma + 1) if kind == "eagle"
                   else MedusaDrafter(head, backend, params, make_generator(0)))
        state = backend.new_state(len(context) + gamma + 1)
        drafter.bind_target_state(state)
        backend.forward(state, context[:-1])
        drafter.start(context)
        def reread_newest() -> None:
            if isinstance(drafter, EagleDrafter):  # the newest committed position is read again each round
                drafter.read = max(0, drafter.read - 1)

        result[kind] = median_seconds(lambda: drafter.propose(context, gamma), reread_newest)
        if kind == "eagle":  # and the target's own 1-token step while it records features for the head
            result["target step recording features"] = median_seconds(lambda: backend.forward(state, context[-1:]),
                                                                      lambda: state.truncate(len(context) - 1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="built-in name, GGUF file or HF directory")
    source.add_argument("--shape", choices=sorted(SHAPES), help="random weights of this architecture")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 (float modes)")
    parser.add_argument("--quantize", default="none", help="none, int8, int4, int4-all (CPU; --model only)")
    parser.add_argument("--context", type=int, default=512, help="tokens already in the cache")
    parser.add_argument("--tokens", default="1,2,4,8,16", help="verification chunk sizes to time")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tree", action="store_true",
                        help="also time each T as a token tree (tree attention: what tree speculation verifies)")
    parser.add_argument("--eager", action="store_true", help="CUDA: no CUDA graphs (SPECDEC_CUDA_GRAPHS=0)")
    parser.add_argument("--heads", type=int, default=0, metavar="GAMMA",
                        help="also time a drafting round of GAMMA tokens by an EAGLE head and by Medusa heads of "
                             "the target's shape (untrained: cost depends on shapes), against the T=1 step")
    parser.add_argument("--kernel-path", default="auto",
                        help="int4 modes: the C++ dot-product path (auto = the best this CPU has; all = every "
                             "path this CPU runs, taking turns at every repeat; or a name: avx512-vnni, avx2)")
    args = parser.parse_args()
    if args.eager:
        os.environ["SPECDEC_CUDA_GRAPHS"] = "0"

    device = specdec.api.resolve_device(args.device)
    if args.shape:
        backend = random_backend(args.shape, specdec.api.resolve_dtype(args.dtype, device), device)
        label = f"{args.shape} (random weights)"
    else:
        backend = specdec.load_model(args.model, args.dtype, device, progress=True, quantize=args.quantize).backend
        label = args.model
    sizes = [int(t) for t in args.tokens.split(",")]
    if args.heads and sizes[0] != 1:
        parser.error("--heads compares against the 1-token step: start --tokens with 1")
    vocab = backend.config.vocab_size
    context = torch.randint(0, vocab, (args.context + max(sizes),), generator=torch.Generator().manual_seed(0)).tolist()
    gpu = torch.cuda.get_device_name(backend.device) if backend.device.type == "cuda" else f"{torch.get_num_threads()} threads"
    graphs = ", CUDA graphs" if getattr(backend, "graphs", None) is not None else ""
    paths = kernel_paths(args.kernel_path) if backend.dtype_name.startswith("int4") else [None]
    print(f"# {label}, {backend.dtype_name} on {backend.device} ({gpu}{graphs}), context {args.context}, "
          f"median of {args.repeats}; weights {backend.weight_bytes / 1e9:.2f} GB per step")
    print(f"# CPU flags: {' '.join(cpu_flags()) or 'none of avx2/avx512/vnni'}")
    print("| tokens T | shape | kernel path | ms per step | × the T=1 step | ms per token | weight GB/s |")
    print("|---|---|---|---|---|---|---|")
    base: dict[str | None, float] = {}
    for tokens in sizes:
        for tree in (False, True) if args.tree and tokens > 1 else (False,):
            medians = time_steps(backend, context[: args.context], context[args.context : args.context + tokens],
                                 args.repeats, paths, tree)
            for path, seconds in medians.items():
                base.setdefault(path, seconds)
                print(f"| {tokens} | {'tree' if tree else 'chain'} | {path or '-'} | {seconds * 1e3:.2f} | "
                      f"{seconds / base[path]:.2f} | {seconds * 1e3 / tokens:.2f} | "
                      f"{backend.weight_bytes / seconds / 1e9:.0f} |", flush=True)
    if args.heads:
        step = next(iter(base.values()))  # the T=1 step (checked below the arguments)
        print("\n| drafter | γ | ms per round | ms per draft token | draft token ÷ the T=1 step |\n|---|---|---|---|---|")
        for kind, seconds in time_heads(backend, context[: args.context], args.heads, args.repeats).items():
            if kind.startswith("target"):
                print(f"| {kind} | – | {seconds * 1e3:.2f} | – | {seconds / step:.3f} (× the plain step) |", flush=True)
                continue
            print(f"| {kind} | {args.heads} | {seconds * 1e3:.2f} | {seconds * 1e3 / args.heads:.2f} | "
                  f"{seconds / args.heads / step:.3f} |", flush=True)


def kernel_paths(choice: str) -> list[str]:
    """The kernel paths ``--kernel-path`` names: every path this CPU runs, one, or the default."""
    available = kernel().kernel_paths()
    if choice == "all":
        return available
    if choice == "auto":
        return [available[0]]
    if choice not in available:
        raise SystemExit(f"--kernel-path {choice}: this CPU runs {', '.join(available)}")
    return [choice]


if __name__ == "__main__":
    main()
