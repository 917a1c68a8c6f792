"""deploy/k8s: every object of every overlay valid against the Kubernetes schema (strict),
and the rules an operator relies on: serve with >= 2 replicas, readiness on /readyz and
liveness on /healthz, no shared writable volume, non-root with a read-only root file system,
requests and limits everywhere, the HPA on the in-flight gauge the service exports, keys
only in Secrets that are not in the repository."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl (its built-in kustomize renders deploy/k8s) "
                                "is not installed")


def _manifests():
    spec = importlib.util.spec_from_file_location("k8s_manifests",
                                                  REPO / "deploy" / "k8s" / "manifests.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    m = _manifests()
    return {o.name: m.render(o) for o in m.overlays()}


def _by(objs: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def test_every_object_is_valid_against_the_schema_and_a_wrong_one_is_not(rendered):
    m = _manifests()
    assert set(rendered) == {"trial", "managed-db"}
    for objs in rendered.values():
        lines = m.validate(objs)
        assert lines and all(line.startswith("ok ") for line in lines), lines
    bad = _by(rendered["trial"], "Deployment", "privbert-serve")
    bad = {**bad, "spec": {**bad["spec"], "replica": 2}}  # a misspelt field
    assert m.validate([bad])[0].startswith("INVALID Deployment/privbert-serve")


def test_serve_replicas_probes_volumes_and_security(rendered):
    for name, objs in rendered.items():
        serve = _by(objs, "Deployment", "privbert-serve")
        assert serve["spec"]["replicas"] >= 2, name
        assert serve["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        pod = serve["spec"]["template"]["spec"]
        c = next(c for c in pod["containers"] if c["name"] == "serve")
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert all("emptyDir" in v for v in pod["volumes"])  # nothing shared between pods
        assert _by(objs, "ConfigMap", "privbert-config")["data"].items() >= {
            "PRIVBERT_MODEL_STORE": "database", "PRIVBERT_RATE_LIMIT_STORE": "database",
            "PRIVBERT_INLINE_WHEN_IDLE": "0"}.items()
        pdb = _by(objs, "PodDisruptionBudget", "privbert-serve")
        assert pdb["spec"]["selector"]["matchLabels"].items() <= \
            serve["spec"]["template"]["metadata"]["labels"].items()
        hpa = _by(objs, "HorizontalPodAutoscaler", "privbert-serve")
        assert {"type": "Pods", "pods": {"metric": {"name": "privbert_requests_in_flight"},
                                         "target": {"type": "AverageValue",
                                                    "averageValue": "16"}}} \
            in hpa["spec"]["metrics"]
        assert not [o for o in objs if o["kind"] == "Secret"]  # created by the operator
        for o in objs:
            if o["kind"] not in ("Deployment", "StatefulSet"):
                continue
            pod = o["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, o["metadata"]["name"]
            for c in pod.get("initContainers", []) + pod["containers"]:
                sc = c["securityContext"]
                assert sc["readOnlyRootFilesystem"] is True and \
                    sc["allowPrivilegeEscalation"] is False, c["name"]
                assert c["resources"]["requests"] and c["resources"]["limits"], c["name"]


def test_the_podman_form_gives_each_serve_pod_its_own_port_and_volumes(rendered):
    m = _manifests()
    pg, app, skipped = m.for_podman(rendered["trial"], [18001, 18002], 15432,
                                    {"PRIVBERT_RATE_LIMIT_PER_KEY": "5"}, None)
    serves = [o for o in app if o["metadata"]["name"].startswith("privbert-serve-")]
    assert len(serves) == 2
    vols = [{v["name"] for v in s["spec"]["template"]["spec"]["volumes"]} for s in serves]
    assert not vols[0] & vols[1]  # podman shares an emptyDir by name: renamed per pod
    ports = [{e["name"]: e["value"] for e in s["spec"]["template"]["spec"]["containers"][0]
              ["env"] if "value" in e}["PRIVBERT_PORT"] for s in serves]
    assert ports == ["18001", "18002"]
    assert "HorizontalPodAutoscaler/privbert-serve" in skipped
    assert [o["kind"] for o in pg] == ["PersistentVolumeClaim", "Deployment"]
