"""A scrape of a library's metrics: Prometheus text, read by prometheus_client's
parser into one value per name (the production library's prefix dropped,
each summed over its labels but a histogram bucket's bound, which stays in
its name: `x_bucket{le="5"}`). A counter the library has not yet
incremented is absent, which reads as zero."""

from __future__ import annotations

import functools

from prometheus_client.parser import text_string_to_metric_families

from kvref.metrics import METRICS, PREFIX

KV_EXPORTS = tuple(m.name for m in METRICS)  # what the contract model judges, where a library has it


def scraped(text: str) -> dict[str, float]:
    return dict(_parsed(text))


@functools.lru_cache(maxsize=8)  # a model judges after every step: most steps leave the scrape as it was
def _parsed(text: str) -> tuple[tuple[str, float], ...]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix(PREFIX)
            if "le" in sample.labels:
                name += f'{{le="{sample.labels["le"]}"}}'
            values[name] = values.get(name, 0.0) + sample.value
    return tuple(values.items())
