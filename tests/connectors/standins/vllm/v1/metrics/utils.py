"""Stand-in for vllm.v1.metrics.utils.create_metric_per_engine: tpu_connector_stats imports it (used only by Prometheus metrics the driver never builds)."""


def create_metric_per_engine(metric, per_engine_labelvalues):
    return {idx: metric.labels(*values) for idx, values in per_engine_labelvalues.items()}
