import sys, time, torch
from torch import nn
from specdec import huge_pages
if sys.argv[1] == "single":
    huge_pages._fault_in = lambda arena: None
holder = nn.Module()
for i in range(100):
    holder.register_buffer(f"b{i}", torch.ones(17 << 20, dtype=torch.uint8))
t = time.perf_counter()
moved = huge_pages.move_to_huge_pages(holder)
print(sys.argv[1], f"moved {moved >> 20} MB in {time.perf_counter() - t:.2f} s", flush=True)
