"""deploy/kubernetes/: every manifest is valid against Kubernetes' own schemas (offline), and what
the manifests say of llmq is true: the settings they set exist, the metric KEDA scales the workers
on is one the API serves, and the clients' sentinels are the ones the Redis StatefulSet runs."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from common.settings import Settings
from tests.support import ROOT

kubernetes_validate = pytest.importorskip("kubernetes_validate")

DEPLOY = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30"


def documents() -> list[dict]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]
    return docs


def of_kind(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in documents() if doc["kind"] == kind}


def test_every_file_is_in_the_kustomization_and_every_core_resource_validates():
    listed = set(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    for doc in documents():
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # a custom resource: checked below
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_llmq_variable_is_a_setting():
    config = of_kind("ConfigMap")["llmq-config"]["data"]
    env = [e["name"] for d in of_kind("Deployment").values()
           for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])]
    for name in [*config, *env]:
        if name.startswith("LLMQ_"):
            assert name.removeprefix("LLMQ_").lower() in Settings.model_fields, name


def test_keda_scales_the_worker_deployment_on_the_apis_demand_figure(api):
    (scaled,) = of_kind("ScaledObject").values()
    assert scaled["spec"]["scaleTargetRef"]["name"] in of_kind("Deployment")
    assert scaled["spec"]["minReplicaCount"] == 0
    (trigger,) = scaled["spec"]["triggers"]
    model = of_kind("ConfigMap")["llmq-config"]["data"]["LLMQ_MODEL"]
    assert trigger["metadata"]["query"] == f'max(llmq_model_desired_workers{{model="{model}"}})'
    assert "llmq_model_desired_workers{" in api.get("/metrics").get_data(as_text=True)


def test_clients_ask_every_sentinel_the_statefulset_runs():
    redis = of_kind("StatefulSet")["redis"]
    service = redis["spec"]["serviceName"]
    expected = {f"redis-{i}.{service}:26379" for i in range(redis["spec"]["replicas"])}
    config = of_kind("ConfigMap")["llmq-config"]["data"]
    assert set(config["LLMQ_REDIS_SENTINELS"].split(",")) == expected


def test_the_redis_scripts_are_valid_shell():
    for name, script in of_kind("ConfigMap")["redis-scripts"]["data"].items():
        result = subprocess.run(["sh", "-n"], input=script, text=True, capture_output=True)
        assert result.returncode == 0, (name, result.stderr)
