"""CPU sets for pinned workers: each worker its own cores, all cores used, none shared."""
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from worker.pinning import format_cpus, parse_cpus, split_cpus


@pytest.mark.parametrize("cpus, workers", [(range(8), 3), (range(2), 2), ([0, 2, 4, 5, 6], 2), (range(16), 16)])
def test_split_gives_disjoint_sets_covering_every_cpu(cpus, workers):
    specs = split_cpus(set(cpus), workers)
    sets = [parse_cpus(spec) for spec in specs]
    assert len(sets) == workers and all(sets)
    assert set().union(*sets) == set(cpus)
    assert sum(map(len, sets)) == len(set(cpus))  # disjoint
    assert max(map(len, sets)) - min(map(len, sets)) <= 1  # even


def test_format_and_parse_round_trip():
    assert format_cpus([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert parse_cpus("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}


def test_more_workers_than_cpus_is_refused():
    with pytest.raises(ValueError, match="cannot give 3 workers"):
        split_cpus({0, 1}, 3)


def test_cli_prints_one_set_per_worker_from_this_process_affinity():
    out = subprocess.run([sys.executable, "-m", "worker.pinning", "1"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == [format_cpus(sorted(os.sched_getaffinity(0)))]
