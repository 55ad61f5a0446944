"""The chart hands the learner's experiment trackers what they need from the cluster: the
W&B key from a Secret (a reference, never the key), the MLflow server's address from
values; a key written into values is refused."""

from __future__ import annotations

import subprocess

import pytest

from rlfleet.kube.manifests import Validator

from .conftest import CHART, CRDS, HYPERPOD, LOCAL
from .test_chart import container, env_of, pod_specs

pytestmark = pytest.mark.deploy

TRACKING = ("learner.tracking.wandb.apiKeySecret.name=wandb-key",
            "learner.tracking.mlflow.trackingUri=http://mlflow.tracking:5000")
NAMES = ("WANDB_API_KEY", "MLFLOW_TRACKING_URI")


def learner_pods(r) -> list[tuple[str, dict]]:  # noqa: ANN001 - conftest's Rendered
    """The pods a learner (the Ray job's driver) or its Ray workers run in."""
    pods = [(owner, tpl) for owner, tpl in pod_specs(r)
            if owner.startswith("RayJob/") and "submitter" not in owner]
    # the Job of mode job runs the learner; raycluster's Job only submits it to the head
    pods += [(f"Job/{o['metadata']['name']}", o["spec"]["template"]) for o in r.of_kind("Job")
             if container(o["spec"]["template"])["name"] == "learner"]
    pods += [(f"Deployment/{o['metadata']['name']}", o["spec"]["template"])
             for o in r.of_kind("Deployment") if o["metadata"]["name"].endswith("-ray-head")]
    return pods


def test_no_tracker_environment_unless_asked(render) -> None:
    for owner, tpl in learner_pods(render(HYPERPOD)):
        assert not set(NAMES) & set(env_of(container(tpl))), owner


@pytest.mark.parametrize("mode", ["rayjob", "raycluster", "job"])
def test_the_learner_gets_the_wandb_key_from_a_secret_and_the_mlflow_uri(render,
                                                                         mode: str) -> None:
    r = render(LOCAL if mode != "rayjob" else HYPERPOD, f"learner.mode={mode}", *TRACKING)
    pods = learner_pods(r)
    assert pods
    for owner, tpl in pods:
        env = env_of(container(tpl))
        assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "wandb-key", "key": "api-key"}, owner
        assert env["MLFLOW_TRACKING_URI"]["value"] == "http://mlflow.tracking:5000", owner
    assert Validator("1.33.0", CRDS).validate_all(r.objects) == []


def test_a_key_written_into_values_is_refused(helm: str) -> None:
    out = subprocess.run([helm, "template", "rlfleet", str(CHART), "-f", str(HYPERPOD),
                          "--set", "learner.tracking.wandb.apiKey=0123456789abcdef"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "'apiKey' not allowed" in out.stderr, out.stderr
    assert "0123456789abcdef" not in out.stdout
