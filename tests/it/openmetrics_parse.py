"""Parses OpenMetrics text from stdin with the Prometheus project's own parser
(prometheus_client.openmetrics.parser) and prints its families as JSON:
[{"name", "type", "unit", "samples": [{"name", "labels", "value"}]}].

Run by tests/it/metrics.rs with prometheus_client (scripts/install-test-peers.sh) on PYTHONPATH.
Any parse error is an uncaught exception: a traceback and a non-zero exit.
"""
import json
import math
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families


def value(v):
    # JSON has no infinities; the test compares finite values only.
    return None if math.isinf(v) or math.isnan(v) else v


families = []
for family in text_string_to_metric_families(sys.stdin.read()):
    families.append({
        "name": family.name,
        "type": family.type,
        "unit": family.unit,
        "samples": [
            {"name": s.name, "labels": s.labels, "value": value(s.value)}
            for s in family.samples
        ],
    })
print(json.dumps(families))
