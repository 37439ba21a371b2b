"""The library from several threads: one call at a time in the process (specdec.api.LIBRARY_CALLS), the shared suffix
table among what they share; a stream holds it only while it steps."""

from __future__ import annotations

import threading

import specdec
from specdec.sampling import SamplingParams

PROMPTS = ["def fibonacci(n):", "x = [1, 2, 3, 1, 2, 3, 1, 2,", "The quick brown fox jumps over the lazy dog. The quick"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def test_threads_share_a_model_and_each_output_is_plain_decodings(tiny_target, tiny_draft):
    expected = {prompt: specdec.generate(tiny_target, prompt, GREEDY).token_ids for prompt in PROMPTS}
    spec = specdec.SpecConfig(method="draft_suffix", num_speculative_tokens=3)
    results: dict[tuple[int, str], list[int]] = {}
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for prompt in PROMPTS:
                if worker % 2:
                    ids = [t for chunk in specdec.stream(tiny_target, prompt, GREEDY, draft=tiny_draft, spec=spec)
                           for t in chunk.token_ids]
                else:
                    ids = specdec.generate(tiny_target, prompt, GREEDY, draft=tiny_draft, spec=spec).token_ids
                results[(worker, prompt)] = ids
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors and len(results) == 4 * len(PROMPTS)
    assert all(ids == expected[prompt] for (_, prompt), ids in results.items())


def test_a_suspended_stream_blocks_no_other_thread(tiny_target):
    chunks = specdec.stream(tiny_target, PROMPTS[0], GREEDY)
    first = next(chunks)
    done = []
    other = threading.Thread(target=lambda: done.append(specdec.generate(tiny_target, PROMPTS[1], GREEDY)))
    other.start()
    other.join(timeout=120)
    assert done, "generate in another thread waited for a suspended stream"
    rest = [t for chunk in chunks for t in chunk.token_ids]
    assert first.token_ids + rest == specdec.generate(tiny_target, PROMPTS[0], GREEDY).token_ids
