"""Which servers the benchmark sets side by side, and their ratio within each round: what a noisy
host's run is read by."""
from __future__ import annotations

from bench.bench import compared_pairs, round_ratios


def test_ratios_are_taken_round_by_round_and_summed_up_by_range_and_median():
    ours = {"rounds": [28.0, 33.3, 30.5]}
    theirs = {"rounds": [29.0, 27.7, 25.9]}  # the host slowed down over the run
    assert round_ratios(ours, theirs) == " (rounds 0.97-1.20, median 1.18)"


def test_two_rounds_show_their_range_without_a_median():
    assert round_ratios({"rounds": [31.6, 24.4]}, {"rounds": [31.1, 31.3]}) == " (rounds 0.78-1.02)"


def test_one_round_has_no_spread_to_show():
    assert round_ratios({"rounds": [30.0]}, {"rounds": [25.0]}) == ""
    assert round_ratios({}, {}) == ""


def test_a_variant_is_set_beside_its_own_engine_ceiling_and_the_peers():
    pairs = compared_pairs(["bf16"])
    assert ("llmq-bf16", "openvino-engine-bf16") in pairs
    assert ("llmq-bf16", "vllm-server") in pairs and ("llmq-openvino", "openvino-engine") in pairs
    assert ("llmq-bf16", "openvino-engine") not in pairs  # another weight format's ceiling says nothing of it
