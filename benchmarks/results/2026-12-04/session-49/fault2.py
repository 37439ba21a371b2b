import mmap, time, sys, threading
import torch
size = 1700 << 20
HUGE = 2 << 20
mode = sys.argv[1]
region = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
whole = torch.frombuffer(region, dtype=torch.uint8)
start = -whole.data_ptr() % HUGE
region.madvise(mmap.MADV_HUGEPAGE, start, size)
arena = whole[start:start + size]
t = time.perf_counter()
if mode == "touch1":
    arena[::HUGE].fill_(1)
elif mode == "touch2":
    halves = [arena[: size // 2], arena[size // 2:]]
    ts = [threading.Thread(target=lambda h=h: h[::HUGE].fill_(1)) for h in halves]
    [x.start() for x in ts]; [x.join() for x in ts]
elif mode == "populate2":
    half = size // 2 // HUGE * HUGE
    def pop(lo, n):
        region.madvise(23, start + lo, n)
    ts = [threading.Thread(target=pop, args=(0, half)), threading.Thread(target=pop, args=(half, size - half))]
    [x.start() for x in ts]; [x.join() for x in ts]
elif mode == "populate1":
    region.madvise(23, start, size)
print(mode, f"{time.perf_counter() - t:.2f} s for {size >> 20} MB")
