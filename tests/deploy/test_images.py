"""The Dockerfiles, checked without a container builder (none runs here): each service
has one, what it copies is in the build context, it runs as a non-root user, and the
package names it picks out of requirements.txt still exist there. `make images` builds
all four."""

from __future__ import annotations

import re
import subprocess

import pytest

from .conftest import ROOT, make_argv

pytestmark = pytest.mark.deploy

SERVICES = {
    # service: (base image prefix, gRPC port, user)
    "env": ("python:3.11-slim", 50051, "10001:10001"),
    "rollout": ("vllm/vllm-openai:", 50052, "10001:10001"),
    "learner": ("rayproject/ray:", None, "1000:100"),
    "ckptsync": ("python:3.11-slim", 50053, "10001:10001"),
}


def requirement_names() -> set[str]:
    names = set()
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.add(re.split(r"[=<>~ ;\[]", line, maxsplit=1)[0].lower())
    return names


def dockerignore_allows(path: str) -> bool:
    allowed = False
    for rule in (ROOT / ".dockerignore").read_text().splitlines():
        rule = rule.strip()
        if not rule or rule.startswith("#"):
            continue
        neg = rule.startswith("!")
        pat = rule.lstrip("!").rstrip("/")
        if pat == "**" or pat == path or pat.removesuffix("/**") == path:
            allowed = neg
    return allowed


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_dockerfile(service: str) -> None:
    base, port, user = SERVICES[service]
    text = (ROOT / "services" / service / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    args = dict(re.match(r"ARG (\w+)=(\S+)", ln).groups() for ln in lines if ln.startswith("ARG "))
    froms = [ln.split()[1] for ln in lines if ln.startswith("FROM ")]
    final = froms[-1]
    final = args.get(final.strip("${}"), final)
    assert final.startswith(base), final
    # The last USER is not root.
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1] == user
    # Every COPY source from the build context exists and passes .dockerignore.
    for ln in lines:
        if ln.startswith("COPY ") and "--from=" not in ln:
            parts = [p for p in ln.split()[1:] if not p.startswith("--")]
            for src in parts[:-1]:
                assert (ROOT / src).exists(), f"{service}: COPY {src}: not in the repository"
                assert dockerignore_allows(src), f"{service}: COPY {src}: excluded by .dockerignore"
    # The packages picked out of requirements.txt by name are still listed there.
    reqs = requirement_names()
    for m in re.finditer(r"grep -i?v?E '\^\(([^)]*)\)", text):
        for name in m.group(1).split("|"):
            assert name.lower() in reqs, f"{service}: {name} is not in requirements.txt"
    assert "grpcio-tools" in reqs
    if port:
        assert f'"rlfleet", "health", "127.0.0.1:{port}"' in text
    if service == "learner":
        ray = next(
            ln
            for ln in (ROOT / "requirements.txt").read_text().splitlines()
            if ln.startswith("ray==")
        )
        assert f"rayproject/ray:{ray.split('==')[1]}-" in text, "Ray image != pinned ray"


def test_make_images_builds_all_four() -> None:
    out = subprocess.run(
        [
            *make_argv(
                "-n", "images", REGISTRY="123456789012.dkr.ecr.us-west-2.amazonaws.com", TAG="t1"
            )
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    for s in SERVICES:
        assert (
            f"-f services/{s}/Dockerfile -t "
            f"123456789012.dkr.ecr.us-west-2.amazonaws.com/rlfleet-{s}:t1"
        ) in out.stdout


def test_the_example_reward_service_has_an_image_of_its_own() -> None:
    """examples/path-efficiency-reward/Containerfile: built on the rlfleet env image (the
    library, the maze, the server bootstrap), non-root, what it copies is in its own build
    context, and the image, command and ports are those the chart's values entry runs."""
    import tomllib

    import yaml

    example = ROOT / "examples" / "path-efficiency-reward"
    text = (example / "Containerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    args = dict(re.match(r"ARG (\w+)=(\S+)", ln).groups() for ln in lines if ln.startswith("ARG "))
    final = [ln.split()[1] for ln in lines if ln.startswith("FROM ")][-1]
    assert args.get(final.strip("${}"), final).startswith("rlfleet-env:")
    assert [ln.split()[1] for ln in lines if ln.startswith("USER ")][-1] == "10001:10001"
    for ln in lines:
        if ln.startswith("COPY "):
            for src in [p for p in ln.split()[1:] if not p.startswith("--")][:-1]:
                assert (example / src).exists(), f"COPY {src}: not in the example's context"
    assert '"rlfleet", "health", "127.0.0.1:50051"' in text
    project = tomllib.loads((example / "pyproject.toml").read_text())["project"]
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "rlfleet" / "values.yaml").read_text())
    entry = next(s for s in values["reward"]["services"] if s["name"] == "path-efficiency")
    assert entry["image"] == {"repository": project["name"], "tag": project["version"]}
    assert 'ENTRYPOINT ["path-efficiency-reward"]' in text
    assert entry["command"][0] in project["scripts"]
    assert entry["command"][1:] == ["--port", "50051", "--metrics-port", "9101"]
    assert "EXPOSE 50051 9101" in text
