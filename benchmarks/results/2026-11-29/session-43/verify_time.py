"""Sampled verification of a k=4 chain at the real vocabulary: all rows transformed (before) vs the
rows reached (after), interleaved, per accepted length (session 43)."""
import time, statistics, torch
from specdec.sampling import SamplingParams, logits_to_probs, make_generator
from specdec.verify import rejection_sample, rejection_sample_rows
torch.set_num_threads(2)
V, k = 151936, 4
g = torch.Generator().manual_seed(0)
logits = torch.randn(k + 1, V, generator=g) * 4
for params in (SamplingParams(temperature=0.7), SamplingParams(temperature=0.7, top_p=0.9)):
    probs = logits_to_probs(logits, params)
    likely = probs.argmax(-1).tolist()
    for accepted in (0, 2, 4):  # tokens the target nearly always accepts up to `accepted`, then a rejected one
        tokens = [likely[i] if i < accepted else (likely[i] + 1) % V for i in range(k)]
        before, after = [], []
        for rep in range(30):
            t = time.perf_counter(); rejection_sample(tokens, None, logits_to_probs(logits, params), make_generator(rep)); before.append(time.perf_counter() - t)
            t = time.perf_counter(); rejection_sample_rows(tokens, None, logits, params, make_generator(rep)); after.append(time.perf_counter() - t)
        print(f"top_p={params.top_p} first rejection at {accepted}: all rows {statistics.median(before)*1e3:.2f} ms, rows reached {statistics.median(after)*1e3:.2f} ms")
