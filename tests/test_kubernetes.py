"""deploy/kubernetes and deploy/grafana, checked offline: each kustomization rendered (by the small renderer
below, and compared with `kubectl kustomize` where kubectl is installed), every object validated against
Kubernetes' schemas (kubernetes-validate ships them), the Deployment's settings loaded as `slidegate serve` would
and its limits by slidegate's own loader; the Envoy Gateway example's config and the Grafana dashboard's queries
against what the server exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from slidegate.config import load_directory
from slidegate.metrics import LimitStat, Metrics
from slidegate.quotas.service import QuotaMetrics
from slidegate.reference_env import UNREAD
from slidegate.settings import SPECS, Settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = ("base", "overlays/demo", "envoy-gateway")
# the renderer below does these and nothing else: a kustomization using more would be rendered wrong
RENDERED_FIELDS = {"apiVersion", "kind", "resources", "namespace", "images"}
CLUSTER_SCOPED = {"Namespace"}


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects ``directory``'s kustomization.yaml makes: its resources (files, or directories rendered
    alike), then its namespace and images applied."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert set(kustomization) <= RENDERED_FIELDS, f"{directory}: fields the test's renderer does not do"
    objects: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        path = directory / resource
        objects += render(path) if path.is_dir() else [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for obj in objects:
        if "namespace" in kustomization and obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = kustomization["namespace"]
        for image in kustomization.get("images", []):
            for container in _containers(obj):
                if container["image"] == image["name"]:
                    container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return objects


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] != "Deployment":
        return []
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    return containers


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [obj for obj in objects if _key(obj) == (kind, name)]
    return found


@pytest.mark.parametrize("where", KUSTOMIZATIONS)
def test_every_object_is_valid_kubernetes(where: str) -> None:
    objects = render(DEPLOY / where)
    assert objects
    version = kubernetes_validate.latest_version()
    for obj in objects:
        # strict: a misspelt or misplaced field is an error, not silently dropped by the API server
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("where", KUSTOMIZATIONS)
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_renders_the_same(where: str) -> None:
    done = subprocess.run(["kubectl", "kustomize", str(DEPLOY / where)], capture_output=True, text=True, timeout=60,
                          check=True)
    theirs = sorted((doc for doc in yaml.safe_load_all(done.stdout) if doc), key=_key)
    assert theirs == sorted(render(DEPLOY / where), key=_key)


def test_a_malformed_object_is_caught() -> None:
    """The validation can fail: a field in the wrong place, and a wrong type."""
    deployment = one(render(DEPLOY / "base"), "Deployment", "slidegate")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readOnlyRootFileSystem"] = True  # belongs in securityContext, and is spelt otherwise
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)
    del container["readOnlyRootFileSystem"]
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_the_deployment_runs_as_envoy_gateways_does() -> None:
    objects = render(DEPLOY / "base")
    deployment = one(objects, "Deployment", "slidegate")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (65534, 65534)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["capabilities"]["drop"] == ["ALL"]
    assert security["allowPrivilegeEscalation"] is False
    assert container["image"] == "slidegate:latest"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"grpc": 8081, "http": 8080, "debug": 6070, "metrics": 19001}
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthcheck", "port": "http"}
    assert container["livenessProbe"]["httpGet"]["port"] in ports
    assert {"requests", "limits"} <= set(container["resources"])
    assert {c["topologyKey"] for c in pod["topologySpreadConstraints"]} == {
        "kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    # every setting is one slidegate reads, and together they load as `slidegate serve` would load them
    env = {item["name"]: item["value"] for item in container["env"]}
    assert set(env) <= {spec.env for spec in SPECS} | {"TMPDIR"}
    settings = Settings.load(env)
    assert (settings.grpc_port, settings.http_port, settings.debug_port) == (8081, 8080, 6070)
    assert settings.prometheus_listener == ("", ports["metrics"])
    # the writable directory is an emptyDir at TMPDIR; the limits come from the ConfigMap at CONFIG_DIR
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts[env["TMPDIR"]]]
    limits = volumes[mounts[env["CONFIG_DIR"]]]["configMap"]["name"]
    one(objects, "ConfigMap", limits)
    # longer than the drain, so in-flight calls finish before the kill
    assert pod["terminationGracePeriodSeconds"] > settings.drain_timeout


def test_service_and_budget_select_the_pods() -> None:
    objects = render(DEPLOY / "base")
    deployment = one(objects, "Deployment", "slidegate")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    named_ports = {port["name"] for port in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    service = one(objects, "Service", "slidegate")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= named_ports
    budget = one(objects, "PodDisruptionBudget", "slidegate")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_the_limits_load(tmp_path: Path) -> None:
    config = one(render(DEPLOY / "base"), "ConfigMap", "slidegate-limits")
    for name, text in config["data"].items():
        (tmp_path / name).write_text(text)
    loaded = load_directory(tmp_path)
    assert set(loaded.domains) == {"example"} and loaded.limit_count() == 2


def test_the_demo_has_its_redis_where_the_base_looks() -> None:
    objects = render(DEPLOY / "overlays" / "demo")
    assert {obj["metadata"].get("namespace") for obj in objects if obj["kind"] != "Namespace"} == {"slidegate-demo"}
    env = {item["name"]: item["value"] for item in
           one(objects, "Deployment", "slidegate")["spec"]["template"]["spec"]["containers"][0]["env"]}
    service = one(objects, "Service", "redis")
    host_port = re.fullmatch(r"redis://([^:/]+):(\d+)/0", env["REDIS_URL"])
    assert host_port is not None
    assert host_port.group(1) == service["metadata"]["name"]
    assert int(host_port.group(2)) == service["spec"]["ports"][0]["port"]
    redis_pod = one(objects, "Deployment", "redis")["spec"]["template"]
    assert service["spec"]["selector"].items() <= redis_pod["metadata"]["labels"].items()


def test_the_envoy_gateway_example_names_slidegates_image() -> None:
    [config_map] = render(DEPLOY / "envoy-gateway")
    assert _key(config_map) == ("ConfigMap", "envoy-gateway-config")
    assert config_map["metadata"]["namespace"] == "envoy-gateway-system"
    config = yaml.safe_load(config_map["data"]["envoy-gateway.yaml"])
    assert (config["apiVersion"], config["kind"]) == ("gateway.envoyproxy.io/v1alpha1", "EnvoyGateway")
    image = config["provider"]["kubernetes"]["rateLimitDeployment"]["container"]["image"]
    assert image.rsplit("/", 1)[-1].startswith("slidegate:")
    # Envoy Gateway passes this on as REDIS_URL with REDIS_SOCKET_TYPE=tcp: slidegate reads that form
    url = config["rateLimit"]["backend"]["redis"]["url"]
    assert Settings.load({"REDIS_URL": url, "REDIS_SOCKET_TYPE": "tcp"}).redis.url == f"redis://{url}"
    assert "GRPC_SERVER_TLS_CA_CERT" in UNREAD  # which Envoy Gateway sets too


def exported_names() -> set[str]:
    """The sample names slidegate's /metrics text holds once every metric has counted (metrics.py's
    Metrics, each count made as the service makes it)."""
    metrics = Metrics()
    for stat in LimitStat:
        metrics.limit_count(stat, "d", "k").inc()
    metrics.domain_not_found("unknown").inc()
    for count in (metrics.config_load_success, metrics.config_load_error, metrics.global_shadow_mode,
                  metrics.storage_errors, metrics.service_errors, metrics.total_requests):
        count.inc()
    metrics.degraded.labels("allow").inc()
    metrics.storage_latency.observe(0.001)
    metrics.call_latency.observe(0.001)
    quotas = QuotaMetrics(metrics.registry)
    quotas.streams.inc()
    quotas.buckets.inc()
    quotas.assignments.labels("d", "token_bucket").inc()
    quotas.reported.labels("d", "allowed").inc()
    quotas.refused.labels("malformed").inc()
    quotas.storage_errors.inc()
    text = metrics.render().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_the_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "slidegate.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries += [variable["query"] for variable in dashboard["templating"]["list"] if variable["type"] == "query"]
    used = {name for query in queries for name in re.findall(r"\bratelimit_[a-z0-9_]+", query)}
    exported = exported_names()
    assert used and used <= exported, f"not exported: {sorted(used - exported)}"
    # and the panels cover the main ones: calls, each outcome, latency, the storage's failures
    for name in ("ratelimit_service_total_requests_total", "ratelimit_service_rate_limit_over_limit_total",
                 "ratelimit_should_rate_limit_latency_seconds_bucket", "ratelimit_storage_errors_total",
                 "ratelimit_degraded_decisions_total", "ratelimit_config_load_error_total",
                 "ratelimit_quota_streams", "ratelimit_quota_reported_requests_total"):
        assert name in used, name
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
