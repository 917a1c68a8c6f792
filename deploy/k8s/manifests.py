"""The Kubernetes manifests of deploy/k8s: render, validate against the Kubernetes schema,
and turn into what `podman kube play` runs on one machine (scripts/k8s_smoke.sh).

    python3 deploy/k8s/manifests.py validate [--k8s-version 1.37.0] [OVERLAY ...]
    python3 deploy/k8s/manifests.py podman OVERLAY --out DIR --serve-ports 18001,18002 \\
        --pg-port 15432 [--set PRIVBERT_X=V ...] [--postgres-image IMG]

``validate`` renders each overlay (default: every folder of overlays/) with ``kubectl
kustomize`` and checks every object against the OpenAPI schema of a Kubernetes release
(``kubernetes-validate``, from PyPI, strict: an unknown field is an error); one line per
object, exit 1 on the first overlay with an invalid one.

``podman`` writes ``postgres.yaml`` and ``privbert.yaml`` for `podman kube play` (podman
4.3 runs Pods, Deployments, PersistentVolumeClaims and ConfigMaps; Secrets are podman
secrets): every pod on the host network on loopback ports (nothing but 127.0.0.1 is
reached), a Deployment of N replicas as N one-pod Deployments each on its own port (on one
host network they cannot share one), the StatefulSet as a Deployment with its claim, and
each emptyDir renamed per pod (podman 4.3 makes an emptyDir a named volume that pods with
the same volume name would share), and no container ports (podman maps them, which a host
network refuses), init containers of type "always" (podman 4.3 fails on a race when it
removes a "once" one) and the restart policy OnFailure (podman 4.3 would restart an init
container that exited 0 under Always). Services, the PodDisruptionBudget, the
HorizontalPodAutoscaler, the NetworkPolicy, the ServiceAccount and the Namespace have no
podman equivalent: they are validated, not run (``skipped`` lists them).
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
K8S_VERSION = "1.37.0"  # the newest release whose schema kubernetes-validate 1.37.0 ships
# podman 4.3 removes a "once" init container as it exits and can fail on a race ("cannot
# remove container ... as it is running"): "always" keeps it (and runs it at every start)
INIT_TYPE = "io.podman.annotations.init.container.type"
NOT_RUN_BY_PODMAN = {"Namespace", "ServiceAccount", "Service", "PodDisruptionBudget",
                     "HorizontalPodAutoscaler", "NetworkPolicy", "Secret"}


def overlays() -> list[Path]:
    return sorted(p for p in (HERE / "overlays").iterdir() if (p / "kustomization.yaml").is_file())


def render(overlay: str | Path) -> list[dict]:
    """The objects of an overlay, as `kubectl kustomize` renders them."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise FileNotFoundError("kubectl (with its built-in kustomize) is needed to render "
                                "deploy/k8s; or run `kustomize build` and pipe it in")
    out = subprocess.run([kubectl, "kustomize", str(overlay)], check=True,
                         capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def validate(objects: list[dict], version: str = K8S_VERSION) -> list[str]:
    """One line per object, ``ok KIND/NAME`` or ``INVALID KIND/NAME: why``."""
    import kubernetes_validate

    lines = []
    for obj in objects:
        what = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            lines.append(f"INVALID {what}: {exc.message} at "
                         f"{'.'.join(str(p) for p in exc.path)}")
            continue
        lines.append(f"ok {what} ({obj['apiVersion']})")
    return lines


# -- podman ----------------------------------------------------------------------------------
def _pod_for_podman(deployment: dict, prefix: str) -> None:
    """Host network; emptyDirs renamed per pod; init containers kept after they ran (podman
    reads that annotation from the Deployment's own metadata, not its template's; see the
    module docstring)."""
    deployment["metadata"].setdefault("annotations", {})[INIT_TYPE] = "always"
    spec = deployment["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    # podman 4.3 gives init containers the pod's restart policy: with Always it runs them
    # again each time they exit; OnFailure still restarts a container that was killed
    spec["restartPolicy"] = "OnFailure"
    renames = {}
    for vol in spec.get("volumes", []):
        if "emptyDir" in vol:
            renames[vol["name"]] = f"{prefix}-{vol['name']}"
            vol["name"] = renames[vol["name"]]
            vol["emptyDir"] = {}
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        c.pop("ports", None)  # podman maps them, which a host network refuses
        for m in c.get("volumeMounts", []):
            m["name"] = renames.get(m["name"], m["name"])


def _set_env(container: dict, values: dict[str, str]) -> None:
    env = [e for e in container.get("env", []) if e["name"] not in values]
    container["env"] = env + [{"name": k, "value": v} for k, v in values.items()]


def _numbered_ports(container: dict, port: int) -> None:
    """Probes on ``port`` (named ports mean nothing on a shared host network)."""
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = container.get(probe, {}).get("httpGet")
        if get:
            get["port"] = port


def for_podman(objects: list[dict], serve_ports: list[int], pg_port: int,
               settings: dict[str, str], postgres_image: str | None
               ) -> tuple[list[dict], list[dict], list[str]]:
    """(postgres objects, privbert objects, skipped kinds/names)."""
    pg, app, skipped = [], [], []
    for obj in copy.deepcopy(objects):
        kind, name = obj["kind"], obj["metadata"]["name"]
        obj["metadata"].pop("namespace", None)
        if kind in NOT_RUN_BY_PODMAN:
            skipped.append(f"{kind}/{name}")
        elif kind == "ConfigMap":
            obj["data"].update(settings)
            app.append(obj)
        elif kind == "PersistentVolumeClaim":
            app.append(obj)
        elif kind == "StatefulSet":  # PostgreSQL: a Deployment with its claim
            spec = obj["spec"]
            for tmpl in spec.pop("volumeClaimTemplates", []):
                claim = f"{tmpl['metadata']['name']}-{name}-0"
                pg.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "metadata": {"name": claim}, "spec": tmpl["spec"]})
                spec["template"]["spec"].setdefault("volumes", []).append(
                    {"name": tmpl["metadata"]["name"],
                     "persistentVolumeClaim": {"claimName": claim}})
            pod = spec["template"]["spec"]
            c = pod["containers"][0]
            if postgres_image:  # Debian's postgresql-15 (deploy/postgres): its own user
                c["image"] = postgres_image
                for k in ("runAsUser", "runAsGroup", "fsGroup"):
                    pod.get("securityContext", {}).pop(k, None)
            c["args"] = [*c["args"], "-c", "listen_addresses=127.0.0.1", "-c",
                         f"port={pg_port}"]
            _set_env(c, {"PGPORT": str(pg_port)})
            for probe in ("readinessProbe", "livenessProbe"):
                cmd = c.get(probe, {}).get("exec", {}).get("command")
                if cmd:
                    cmd += ["-p", str(pg_port)]
            deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": obj["metadata"],
                          "spec": {"replicas": 1, "selector": spec["selector"],
                                   "template": spec["template"]}}
            _pod_for_podman(deployment, name)
            pg.append(deployment)
        elif kind == "Deployment" and obj["spec"].get("replicas", 1) > 1:  # serve
            n = obj["spec"]["replicas"]
            if n != len(serve_ports):
                raise ValueError(f"{name} has {n} replicas: give {n} --serve-ports")
            for i, port in enumerate(serve_ports):
                one = copy.deepcopy(obj)
                one["metadata"]["name"] = f"{name}-{i}"
                one["spec"]["replicas"] = 1
                _pod_for_podman(one, f"{name}-{i}")
                pod = one["spec"]["template"]["spec"]
                for c in pod["containers"]:
                    _set_env(c, {"PRIVBERT_PORT": str(port), "PRIVBERT_HOST": "127.0.0.1"})
                    _numbered_ports(c, port)
                app.append(one)
        elif kind == "Deployment":
            _pod_for_podman(obj, name)
            app.append(obj)
        else:
            raise ValueError(f"{kind}/{name}: no podman rule for this kind")
    return pg, app, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    va = sub.add_parser("validate")
    va.add_argument("overlay", nargs="*")
    va.add_argument("--k8s-version", default=K8S_VERSION)
    po = sub.add_parser("podman")
    po.add_argument("overlay")
    po.add_argument("--out", required=True, type=Path)
    po.add_argument("--serve-ports", required=True)
    po.add_argument("--pg-port", required=True, type=int)
    po.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    po.add_argument("--postgres-image")
    args = ap.parse_args(argv)
    if args.command == "validate":
        bad = 0
        for overlay in args.overlay or overlays():
            lines = validate(render(overlay), args.k8s_version)
            for line in lines:
                print(f"{Path(overlay).name}: {line}")
            bad += sum(line.startswith("INVALID") for line in lines)
        print(f"{'all' if not bad else bad} objects {'valid' if not bad else 'INVALID'} "
              f"against Kubernetes {args.k8s_version} (kubernetes-validate, strict)")
        return 1 if bad else 0
    settings = dict(s.split("=", 1) for s in args.set)
    pg, app, skipped = for_podman(render(args.overlay),
                                  [int(p) for p in args.serve_ports.split(",")],
                                  args.pg_port, settings, args.postgres_image)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "postgres.yaml").write_text(yaml.safe_dump_all(pg, sort_keys=False))
    (args.out / "privbert.yaml").write_text(yaml.safe_dump_all(app, sort_keys=False))
    print(json.dumps({"postgres": [f"{o['kind']}/{o['metadata']['name']}" for o in pg],
                      "privbert": [f"{o['kind']}/{o['metadata']['name']}" for o in app],
                      "skipped": skipped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
