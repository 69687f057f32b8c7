"""Parse Prometheus text (as scraped) into {(sample name, frozen labels): value}."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))
