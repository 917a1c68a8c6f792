"""The container images end to end: `scripts/image.sh smoke` (slow: it builds both images,
from cached layers after the first time, then runs deploy/compose.yaml with a tiny model).

Skipped, with the reason, where neither a Docker engine answers nor buildah can run (not
installed and not installable, or refused by this machine's kernel or permissions).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

SERVE_MAX_MB = 450
TRAIN_MAX_MB = 1900


def _cannot_build() -> str | None:
    """Why no image can be built here, or None."""
    if shutil.which("docker"):
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
        if info.returncode == 0:
            return None
    if shutil.which("buildah") is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            return ("no Docker engine, and buildah is not installed and cannot be here (needs "
                    "root and apt-get: apt-get install buildah podman runc debootstrap "
                    "podman-compose)")
        return None  # scripts/image.sh installs it
    info = subprocess.run(["buildah", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        last = (info.stderr.strip().splitlines() or ["no message"])[-1]
        return f"buildah cannot run here: {last}"
    return None


def _image_sh(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / "image.sh"), *args], cwd=REPO,
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=1800)


@pytest.mark.slow
def test_image_smoke():
    reason = _cannot_build()
    if reason:
        pytest.skip(reason)
    # the host side (tiny BERT, edge-agent) runs with this interpreter
    r = _image_sh("smoke", env={"PRIVBERT_PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.strip().splitlines()[-1] == "smoke: ok"
    sizes = dict(re.findall(r"size \S+/privbert-(serve|train)\S*: (\d+) MB", r.stderr))
    assert set(sizes) == {"serve", "train"}, r.stderr[-2000:]
    assert int(sizes["serve"]) <= SERVE_MAX_MB
    assert int(sizes["train"]) <= TRAIN_MAX_MB
    for step in ("tripwire: no key", "HEALTHCHECK passed", "run as 10001:10001",
                 "trained by the worker container, promoted, serving predictions"):
        assert step in r.stderr, step


@pytest.mark.slow
def test_image_build_failures_are_one_line_and_tag_nothing():
    reason = _cannot_build()
    if reason:
        pytest.skip(reason)
    r = _image_sh("build", env={"PRIVBERT_BASE_IMAGE": "localhost/privbert-no-such-base:0"})
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("image.sh: base failed: cannot pull "
                           "PRIVBERT_BASE_IMAGE=localhost/privbert-no-such-base:0"), last
    # an index that refuses connections: the serve build fails in its pip step, says what
    # to set, and the tag it would have had names no image
    tag = "localhost/privbert-serve-badindex:test"
    r = _image_sh("build", env={"PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                                "PIP_FIND_LINKS": "",
                                "PRIVBERT_SERVE_IMAGE": tag})
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("image.sh: build serve failed: a package index is unreachable: "
                           "set PIP_INDEX_URL"), last
    engine = "podman" if shutil.which("podman") else "docker"
    assert subprocess.run([engine, "image", "inspect", tag], capture_output=True).returncode != 0
