"""Stand-in for vllm's connector metrics types: both connectors subclass KVConnectorStats (a dataclass holding `data`); tpu_connector_stats imports the Prometheus ones, which the driver never builds."""

from dataclasses import dataclass, field
from typing import Any, TypeVar


@dataclass
class KVConnectorStats:
    data: dict[str, Any] = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other):
        raise NotImplementedError

    def reduce(self):
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError


class PromMetric:
    """A Prometheus metric type (never instantiated by the driver)."""


PromMetricT = TypeVar("PromMetricT", bound=PromMetric)


class KVConnectorPromMetrics:
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        self.per_engine_labelvalues = per_engine_labelvalues
