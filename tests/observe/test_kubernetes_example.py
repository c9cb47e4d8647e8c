"""The worked Kubernetes example (`deploy/kubernetes`): the KEDA ScaledObject scales the
vLLM Deployment on series the gateway and vLLM really export, for the model the gateway's
config (which the gateway's own parser accepts) serves."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from inhouse.gateway import metric_names
from inhouse.gateway.config_file import parse_config
from inhouse.gateway.metrics import GatewayMetrics
from inhouse.launch import BACKENDS

KUBE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
SERIES = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{")


def documents() -> dict[tuple[str, str], dict]:
    found = {}
    for path in sorted(KUBE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def exported_by_the_gateway() -> set[str]:
    registry = GatewayMetrics(100, ["m"]).registry
    return {family.name for family in registry.collect()}


def test_the_scaled_object_reads_series_the_gateway_and_vllm_export(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "from-the-secret")  # the Deployment's env, as there
    docs = documents()
    scaled = docs[("ScaledObject", "vllm")]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "vllm"
    assert ("Deployment", "vllm") in docs
    spec = scaled["spec"]
    assert 1 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    named = set(SERIES.findall(query))
    assert metric_names.QUEUE_DEPTH in named
    known = exported_by_the_gateway() | BACKENDS["vllm"].metrics.all_names()
    assert named <= known, named - known
    config_map = docs[("ConfigMap", "inhouse-gateway")]
    config = parse_config(tomllib.loads(config_map["data"]["inhouse.toml"]))
    (route,) = config.models
    assert set(re.findall(r'model_name="([^"]+)"', query)) == {route.name}
    (backend,) = route.backends
    assert backend.url == "http://vllm:8000" and backend.kind == "vllm"


def test_the_autoscaling_series_are_exported_under_their_names() -> None:
    exported = exported_by_the_gateway()
    for name in (metric_names.REPLICAS, metric_names.REPLICAS_MAX, metric_names.QUEUE_DEPTH):
        assert name in exported
    assert metric_names.SCALE_EVENTS in exported  # a counter: its samples end in _total
