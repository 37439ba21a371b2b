"""Whole-model forward seconds by rows on each kernel path, interleaved (session 43).
Usage: python paths_model.py MODEL MODE"""
import sys, time, statistics, torch, specdec
from specdec.kernels.build import kernel_paths, use_kernel_path
torch.set_num_threads(2)
name, mode = sys.argv[1], sys.argv[2]
m = specdec.load_model(name, quantize=mode)
b = m.backend
prompt = list(range(1000, 1200))
sizes = (1, 2, 3, 5, 9)
paths = kernel_paths()
state = b.new_state(512)
b.forward(state, prompt, num_logits=1)
L = state.seq_len
t = {(p, T): [] for p in paths for T in sizes}
for rep in range(12):
    for p in paths:
        with use_kernel_path(p):
            for T in sizes:
                s = time.perf_counter(); b.forward(state, [2000 + j for j in range(T)]); t[(p, T)].append(time.perf_counter() - s)
                state.truncate(L)
print(name, mode, "ms per forward of T rows (min of 10 after 2 warm-up, interleaved)")
for p in paths:
    med = {T: min(t[(p, T)][2:]) * 1e3 for T in sizes}
    print(f"  {p:12s} " + " ".join(f"T{T} {v:6.1f}" for T, v in med.items()) + f"   T5/T1 {med[5]/med[1]:.2f}  T9/T1 {med[9]/med[1]:.2f}")
