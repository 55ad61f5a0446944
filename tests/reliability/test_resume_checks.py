"""A resume that checks what it resumes, and replicas that check what they serve.

- A run's checkpoint records its base model (path and fingerprint), LoRA settings and
  task settings. Resuming it with another LoRA rank, another base model (the same
  architecture, other weights) or another LoRA alpha is refused before Ray starts (the
  learner is pointed at a Ray address nothing listens on, so reaching Ray would fail
  otherwise), with one line naming each difference, exit 2, nothing written; with
  `resume_allow_changes: [lora]` the alpha change resumes, trains on, and the run's
  metrics.jsonl records it.
- A replica refuses an adapter version trained on another base model: ckpt-sync's wait
  names the refusal, a group asking for that version answers FAILED_PRECONDITION naming
  it at once, and the learner's publisher, when no replica serves it, stops naming it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest

from rlfleet.local.metrics_jsonl import lineage_steps, read_events
from rlfleet.local.stack import LocalStack
from rlfleet.policy.fingerprint import model_fingerprint
from rlfleet.storage import RunsRoot, list_checkpoints, list_versions, publish_adapter_dir
from rlfleet.storage.checkpoints import read_checkpoint_identity
from rlfleet.v1 import common_pb2, sync_pb2
from rlfleet_learner.faults import ReplicasLost
from rlfleet_learner.publisher import AdapterPublisher
from tests import factories
from tests.factories import NO_EVAL, REPO, SFT, learner_process
from tests.reliability.conftest import Fleet, Sync, group, lora_files, stream_code
from tests.waits import scaled

RUN = "checked"
OTHER_BASE = REPO / "warm-starts" / "tiny-sft-feedback"  # SFT's architecture, other weights
NOWHERE = "127.0.0.1:9"  # a Ray address nothing listens on: reaching Ray would fail


def config(stack: LocalStack, tmp_path: Path, name: str, model: dict | None = None,
           **sections: object) -> Path:
    path = factories.learner_config(
        stack, tmp_path, RUN, model={"lora_rank": 16, **(model or {})},
        data=factories.HOT_SHORT_EPISODES, eval=NO_EVAL, steps=2,
        checkpoint={"every": 1, "keep_last": 2}, fleet={"max_groups_in_flight": 2},
        **sections)
    return path.rename(tmp_path / f"{name}.yaml")


def run_learner(path: Path, steps: int) -> tuple[int, str]:
    proc = learner_process(path, steps=steps)
    try:
        out, _ = proc.communicate(timeout=scaled(900))
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out


@pytest.mark.slow
def test_resume_with_other_settings_refused_before_ray_unless_allowed(
        stack: LocalStack, tmp_path: Path) -> None:
    root = RunsRoot(stack.runs_root)
    metrics = root.metrics_path(RUN)
    code, out = run_learner(config(stack, tmp_path, "base"), steps=2)
    assert code == 0, out
    recorded = read_checkpoint_identity(root.checkpoint_dir(RUN, 2))
    assert recorded is not None
    assert recorded["lora"] == {"rank": 16, "alpha": 32, "dropout": 0.0,
                                "modules": sorted(recorded["lora"]["modules"])}
    assert recorded["model"]["sha256"] == model_fingerprint(SFT)

    before = (metrics.read_bytes(), list_versions(root, RUN), list_checkpoints(root, RUN))
    refused = {
        "rank": ({"lora_rank": 8}, ["lora.rank 16 -> 8", "lora.alpha 32 -> 16"]),
        "base": ({"path": str(OTHER_BASE)}, [f"model {SFT} (sha256 ", f"-> {OTHER_BASE} "
                                                                     "(sha256 "]),
        "alpha": ({"lora_alpha": 7}, ["lora.alpha 32 -> 7"]),
        "both": ({"lora_rank": 8, "lora_alpha": 7},
                 ["lora.rank 16 -> 8", "lora.alpha 32 -> 7"]),
    }
    for name, (model, named) in refused.items():
        code, out = run_learner(config(stack, tmp_path, name, model,
                                       ray={"address": NOWHERE}), steps=4)
        assert code == 2, (name, out)
        lines = [line for line in out.splitlines() if "trained with other settings" in line]
        assert len(lines) == 1 and "Traceback" not in out, (name, out)
        for words in named:
            assert words in lines[0], (name, lines[0])
        assert (metrics.read_bytes(), list_versions(root, RUN),
                list_checkpoints(root, RUN)) == before, name
    # a rank no flag allows; an alpha the config says is meant
    code, out = run_learner(config(stack, tmp_path, "rank_allowed", {"lora_rank": 8},
                                   ray={"address": NOWHERE}, resume_allow_changes=["lora"]),
                            steps=4)
    assert code == 2 and "lora.rank cannot change on a resume" in out, out

    code, out = run_learner(config(stack, tmp_path, "alpha_allowed", {"lora_alpha": 7},
                                   resume_allow_changes=["lora"]), steps=4)
    assert code == 0, out
    events = read_events(metrics)
    changes = [e for e in events if e["event"] == "resume_changes"]
    assert len(changes) == 1 and changes[0]["step"] == 2, changes
    assert changes[0]["changes"] == [{"setting": "lora.alpha", "checkpoint": 32, "now": 7}]
    assert changes[0]["allowed"] == ["lora"]
    assert [s["step"] for s in lineage_steps(events)] == [1, 2, 3, 4]
    assert read_checkpoint_identity(root.checkpoint_dir(RUN, 4))["lora"]["alpha"] == 7


def test_replica_refuses_an_adapter_for_another_base(fleet: Fleet) -> None:
    fleet.start_redis()
    fleet.start_env()
    fleet.start_sync()
    (replica,) = fleet.start_replicas(["r1"], "--adapter-wait-s", str(scaled(60)))
    ours, theirs = model_fingerprint(fleet.model_dir), model_fingerprint(OTHER_BASE)
    assert ours != theirs

    def publish(version: int, base_sha256: str) -> None:
        publish_adapter_dir(fleet.root, fleet.run, version,
                            lora_files(fleet.model_dir, version), base_model="tiny",
                            step=version, base_sha256=base_sha256)
        fleet.sync_client().call(Sync, "Publish", sync_pb2.PublishRequest(
            adapter=common_pb2.AdapterRef(run=fleet.run, version=version)))

    publish(1, ours)
    assert fleet.wait_replicas(1, 1) == ["r1"]
    publish(2, theirs)
    with pytest.raises(grpc.RpcError) as waited:
        fleet.wait_replicas(2, 1, timeout_s=scaled(20))
    assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "replica r1 refused version 2" in (waited.value.details() or "")
    assert "trained on another base model (tiny, sha256 " f"{theirs[:12]}" \
        in (waited.value.details() or "")
    # a group asking for that version: refused now (not after the 60 s wait), naming why
    code, got, details = stream_code(replica.address or "", group(min_version=2))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and not got
    assert f"was trained on another base model (tiny, sha256 {theirs[:12]}) than this " \
           f"replica serves (sha256 {ours[:12]})" in details, details
    assert fleet.status(replica).adapter.version == 1  # still serving its own base's
    # the learner's publisher, when no replica serves the version, stops naming the reason
    publisher = AdapterPublisher(fleet.root, fleet.run, "tiny", fleet.sync_service())
    with pytest.raises(ReplicasLost) as lost:
        publisher.wait_live(2, 1, timeout_s=scaled(2), replacement_wait_s=scaled(2))
    assert "replica r1 refused version 2" in str(lost.value)
    assert "trained on another base model" in str(lost.value)
