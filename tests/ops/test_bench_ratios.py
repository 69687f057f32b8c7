"""The benchmark's ratio of two servers within each round: what a noisy host's run is read by."""
from __future__ import annotations

from bench.bench import round_ratios


def test_ratios_are_taken_round_by_round_and_summed_up_by_range_and_median():
    ours = {"rounds": [28.0, 33.3, 30.5]}
    theirs = {"rounds": [29.0, 27.7, 25.9]}  # the host slowed down over the run
    assert round_ratios(ours, theirs) == " (rounds 0.97-1.20, median 1.18)"


def test_two_rounds_show_their_range_without_a_median():
    assert round_ratios({"rounds": [31.6, 24.4]}, {"rounds": [31.1, 31.3]}) == " (rounds 0.78-1.02)"


def test_one_round_has_no_spread_to_show():
    assert round_ratios({"rounds": [30.0]}, {"rounds": [25.0]}) == ""
    assert round_ratios({}, {}) == ""
