"""The one Dockerfile, checked without building (tests/deploy/test_in_cluster.py builds and
runs every image for real): what it copies is in the build context, it ends as a non-root
user, the dependencies it installs are pyproject.toml's declarations for the service's
extra, and `make images` picks each service's official base for the hyperpod profile."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.deploy

sys.path.insert(0, str(ROOT / "scripts" / "images"))
from declared_deps import declared  # noqa: E402

SERVICES = ("env", "rollout", "learner", "ckptsync")


def dockerignore_allows(path: str) -> bool:
    allowed = False
    for rule in (ROOT / ".dockerignore").read_text().splitlines():
        rule = rule.strip()
        if not rule or rule.startswith("#"):
            continue
        neg = rule.startswith("!")
        pat = rule.lstrip("!").rstrip("/")
        tree = pat.removesuffix("/**")
        if pat == "**" or pat == path or tree == path or (
                pat.endswith("/**") and path.startswith(tree + "/")):
            allowed = neg
    return allowed


def dockerfile_lines() -> list[str]:
    text = (ROOT / "Dockerfile").read_text()
    lines = (ln.strip() for ln in text.splitlines())
    return [ln for ln in lines if ln and not ln.startswith("#")]


def test_dockerfile_copies_only_what_the_context_holds_and_ends_unprivileged() -> None:
    lines = dockerfile_lines()
    for ln in lines:
        if ln.startswith("COPY ") and "--from=" not in ln:
            for src in [p for p in ln.split()[1:] if not p.startswith("--")][:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
                assert dockerignore_allows(src), f"COPY {src}: excluded by .dockerignore"
    args = dict(m.groups() for ln in lines if (m := re.match(r"ARG (\w+)=(\S+)$", ln)))
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users[-1] == "${UID}" and args["UID"] == "10001"
    assert args["BASE_IMAGE"].startswith("python:3.11-slim")
    assert 'ENTRYPOINT ["/opt/rlfleet/entrypoint.sh"]' in lines


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_installs_its_declared_extra(service: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = declared(project, [service])
    assert set(project["dependencies"]) <= set(deps)
    # names as the lock writes them (PEP 503: case and -_. do not matter): tensorboardX
    names = {re.sub(r"[-_.]+", "-", re.split(r"[=<>~ ;\[]", d, maxsplit=1)[0]).lower()
             for d in deps}
    if service in ("rollout", "learner"):
        assert {"torch", "transformers", "peft"} <= names
    else:
        assert "torch" not in names, f"{service}'s image must stay slim"
    if service == "learner":
        assert "ray" in names
    # Every declared requirement has its exact version in the lock.
    lock = {ln.split("==")[0] for ln in (ROOT / "requirements.txt").read_text().splitlines()
            if "==" in ln and not ln.startswith("#")}
    assert names <= lock, names - lock


def test_make_images_uses_the_official_bases_for_hyperpod() -> None:
    out = subprocess.run(
        ["bash", "scripts/images/build.sh", "--dry-run",
         "--prefix", "123456789012.dkr.ecr.us-west-2.amazonaws.com", "--tag", "t1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "IMAGE_TOOL": "docker"})
    assert out.returncode == 0, out.stderr
    builds = [ln for ln in out.stderr.splitlines() if ln.startswith("docker build")]
    assert len(builds) == 4
    base = {"env": "python:3.11-slim", "ckptsync": "python:3.11-slim",
            "rollout": "vllm/vllm-openai:", "learner": "rayproject/ray:2.60.0-"}
    for svc, line in zip(SERVICES, builds, strict=True):
        assert f"-t 123456789012.dkr.ecr.us-west-2.amazonaws.com/rlfleet-{svc}:t1" in line
        assert f"SERVICE={svc}" in line and f"EXTRAS={svc}" in line
        assert f"BASE_IMAGE={base[svc]}" in line
        assert "-f Dockerfile" in line
    # vLLM's CUDA torch stays: the rollout image installs without the CPU lock.
    assert "LOCK= " in builds[1] or builds[1].endswith("LOCK=")


def test_the_example_reward_service_has_an_image_of_its_own() -> None:
    """examples/path-efficiency-reward/Containerfile: built on the rlfleet env image, non-root,
    what it copies is in its own build context, and the image, command and ports are those
    the chart's values entry runs."""
    import yaml

    example = ROOT / "examples" / "path-efficiency-reward"
    text = (example / "Containerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    args = dict(m.groups() for ln in lines if (m := re.match(r"ARG (\w+)=(\S+)$", ln)))
    final = [ln.split()[1] for ln in lines if ln.startswith("FROM ")][-1]
    assert args.get(final.strip("${}"), final).startswith("rlfleet-env:")
    assert [ln.split()[1] for ln in lines if ln.startswith("USER ")][-1] == "10001:10001"
    for ln in lines:
        if ln.startswith("COPY "):
            for src in [p for p in ln.split()[1:] if not p.startswith("--")][:-1]:
                assert (example / src).exists(), f"COPY {src}: not in the example's context"
    project = tomllib.loads((example / "pyproject.toml").read_text())["project"]
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "rlfleet" / "values.yaml").read_text())
    entry = next(s for s in values["reward"]["services"] if s["name"] == "path-efficiency")
    assert entry["image"] == {"repository": project["name"], "tag": project["version"]}
    assert 'ENTRYPOINT ["path-efficiency-reward"]' in text
    assert entry["command"][0] in project["scripts"]
    assert entry["command"][1:] == ["--port", "50051", "--metrics-port", "9101"]
