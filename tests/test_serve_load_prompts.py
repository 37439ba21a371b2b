"""benchmarks/serve_load.py deals prompts to its passes so that speculation on and off at a level are
measured on prompts of the same kind: consecutive blocks of HumanEval gave one mode far longer prompts.
Its ``--variant`` servers take environment settings and flags."""

from __future__ import annotations

import statistics
import sys

import pytest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from serve_load import deal_prompts, parse_variant  # noqa: E402


def test_every_pass_draws_from_the_whole_dataset_without_sharing_prompts():
    counts = [8, 8, 16, 16, 32, 32]
    dealt = deal_prompts(163, counts)
    assert [len(indices) for indices in dealt] == counts
    everything = [i for indices in dealt for i in indices]
    assert len(set(everything)) == len(everything)  # no prompt answered twice (suffix table, prefix cache)
    for off, on in zip(dealt[::2], dealt[1::2]):  # a level's two modes: the same part of the dataset
        assert abs(statistics.mean(off) - statistics.mean(on)) <= 1 + len(counts)
        assert max(off) - min(off) >= 0.5 * len(everything) - len(counts)


def test_a_small_dataset_wraps_around():
    dealt = deal_prompts(5, [4, 4])
    assert [len(indices) for indices in dealt] == [4, 4]
    assert all(0 <= i < 5 for indices in dealt for i in indices)


def test_a_variant_takes_environment_settings_then_flags():
    assert parse_variant("fbgemm=SPECDEC_INT8_KERNEL=fbgemm") == ("fbgemm", {"SPECDEC_INT8_KERNEL": "fbgemm"}, [])
    assert parse_variant("b=A=1 B=x=y --max-num-batched-tokens 256") == (
        "b", {"A": "1", "B": "x=y"}, ["--max-num-batched-tokens", "256"])
    assert parse_variant("plain=--draft-quantize int8") == ("plain", {}, ["--draft-quantize", "int8"])


@pytest.mark.parametrize("bad", ["oops=SETTING --flag", "=A=1"])
def test_a_malformed_variant_is_refused_by_name(bad):
    with pytest.raises(SystemExit, match="--variant"):
        parse_variant(bad)
