"""benchmarks/serve_load.py deals prompts to its levels so that every level draws prompts of the same
kind (consecutive blocks of HumanEval gave some passes far longer prompts) and none answers a prompt
another level sent; both modes of a level send the same prompts. Its ``--variant`` servers take
environment settings and flags."""

from __future__ import annotations

import statistics
import sys

import pytest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from serve_load import deal_prompts, parse_variant  # noqa: E402


def test_every_level_draws_from_the_whole_dataset_without_sharing_prompts():
    counts = [8, 16, 32, 8]
    dealt = deal_prompts(163, counts)
    assert [len(indices) for indices in dealt] == counts
    everything = [i for indices in dealt for i in indices]
    assert len(set(everything)) == len(everything)  # no prompt answered twice (suffix table, prefix cache)
    middle = statistics.mean(everything)
    for indices in dealt:  # each level: the same part of the dataset as the others
        assert abs(statistics.mean(indices) - middle) <= 1 + len(counts)
        assert max(indices) - min(indices) >= 0.5 * len(everything) - len(counts)


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
