"""The one-row kernel A/B of README section 3: runs only with one_row_avx512.patch applied (it adds
specdec/kernels/one_row.py and use_q4_one_row_512). Usage: one_row_ab.py MODEL QUANTIZE."""
import statistics, sys, time, torch
import specdec
from specdec.kernels.build import kernel, use_q4_one_row_512
from specdec.kernels import one_row
m = kernel()
for i in range(3):
    print("probe", one_row.time_kernels(m))
name, quant = sys.argv[1], sys.argv[2]
model = specdec.load_model(name, quantize=quant, device="cpu")
dec = model.backend.decoder
cache = dec.new_cache(600)
toks = torch.randint(0, 1000, (512,))
with torch.no_grad():
    dec(toks, torch.arange(512), cache)
    times = {False: [], True: []}
    for rep in range(40):
        for wide in (False, True):
            with use_q4_one_row_512(wide):
                t = time.perf_counter()
                dec(torch.tensor([5]), torch.tensor([512]), cache)
                times[wide].append(time.perf_counter() - t)
print(name, quant, {k: round(statistics.median(v) * 1e3, 2) for k, v in times.items()})
