"""The learner's experiment trackers against the real things: a short learner run on a
local fleet reports to a real MLflow tracking server (`mlflow server`, SQLite store) that
the test starts, and to W&B in offline mode; the test reads back what each holds (MLflow's
client; wandb's own reader of the run's .wandb file). A resumed run continues the same
tracker run; a tracking server killed mid-run does not stop training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.local.procs import Proc, ProcessGroup, free_port
from rlfleet.local.stack import LocalStack, start_stack
from tests import factories
from tests.factories import SFT, learner_process
from tests.unit.test_learner_tensorboard import expected_scalars, read_event_scalars
from tests.waits import SCALE, scaled, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trackers")]

# two steps of 2 groups of 4 four-turn episodes sampled hot (every step trains), one
# trainer rank, a checkpoint every step (to resume from); an eval at the start and the end
# on 2 mazes, enough to be tracked
STEPS = 2
EVAL = {"every": 0, "eval_seeds": 2, "heldout_seeds": 0, "at_start": True,
        "accept_turn_cap": True}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """One fleet for the module (each test's learner runs on a run, and a replica, of its
    own): no test here stops a service of it."""
    work = tmp_path_factory.mktemp("trackers")
    group = ProcessGroup(work / "logs", wait_scale=SCALE)
    try:
        yield start_stack(work, runs_root=work / "runs", run="mlflow-run", model_dir=SFT,
                          replicas=1, reward="format+task", group=group)
    finally:
        group.stop_all()


def start_mlflow(group: ProcessGroup, work: Path, name: str = "mlflow") -> tuple[Proc, str]:
    """A real MLflow tracking server on loopback (SQLite store, artifacts served through
    it); its URI once it answers its health check."""
    import urllib.request

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    (work / name).mkdir(parents=True, exist_ok=True)
    mlflow = Path(sys.executable).with_name("mlflow")
    proc = group.start(name, [str(mlflow), "server", "--host", "127.0.0.1", "--port",
                              str(port), "--workers", "1",
                              "--backend-store-uri", f"sqlite:///{work / name / 'db.sqlite'}",
                              "--artifacts-destination", str(work / name / "artifacts")])

    def healthy() -> bool:
        assert proc.alive, proc.log_tail()
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
            return answer.status == 200

    wait_until("the MLflow server to answer", healthy, timeout_s=180, period_s=0.5,
               diagnose=proc.log_tail)
    return proc, uri


@pytest.fixture(scope="module")
def mlflow_uri(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> str:
    _, uri = start_mlflow(stack.group, tmp_path_factory.mktemp("mlflow-server"))
    return uri


def config(stack: LocalStack, tmp_path: Path, run: str, **over: object) -> Path:
    if run != stack.run:
        stack.add_replica(f"replica-{run}", run=run)
    sections = {"steps": STEPS, "eval": EVAL, "checkpoint": {"every": 1, "keep_last": 2},
                "ray": {"num_workers": 1}, **over}
    return factories.learner_config(stack, tmp_path, run, data=factories.HOT_SHORT_EPISODES,
                                    fleet={"max_groups_in_flight": 2}, **sections)


def train(config_path: Path, steps: int | None = None) -> str:
    """A learner run to its end (or on from its last checkpoint); its output (warnings)."""
    proc = learner_process(config_path, resume="auto", steps=steps)
    out, _ = proc.communicate(timeout=scaled(900))
    assert proc.returncode == 0, out
    return out


def events(stack: LocalStack, run: str, kind: str) -> list[dict]:
    lines = (stack.runs_root / run / "metrics.jsonl").read_text().splitlines()
    return [d for d in map(json.loads, lines) if d["event"] == kind]


def tracker_entry(stack: LocalStack, run: str, tracker: str) -> dict:
    return json.loads((stack.runs_root / run / "trackers.json").read_text())[tracker]


def test_mlflow_wandb_and_tensorboard_get_a_runs_steps_evals_and_files_and_follow_its_resume(
        stack: LocalStack, mlflow_uri: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # one learner reports to all three, as a user's may: each tracker's content is read
    # back and compared with metrics.jsonl; then the run resumes for one more step
    run = stack.run
    wandb_dir = tmp_path / "wandb-dir"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")  # the usual environment, not the config
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_PROJECT", "trackers-test")
    path = config(stack, tmp_path, run, report_to=["mlflow", "wandb", "tensorboard"],
                  mlflow={"tracking_uri": mlflow_uri, "experiment": "trackers-test"})
    train(path)
    mlflow_run_id = check_mlflow_run(stack, run, mlflow_uri, tmp_path)
    wandb_run_id = check_wandb_offline_run(stack, run, wandb_dir)
    # TensorBoard, from the same events
    scalars = read_event_scalars(stack.runs_root / run)
    assert {k: v for k, (v, _) in scalars.items()} == pytest.approx(
        expected_scalars(stack.runs_root / run / "metrics.jsonl"))

    # resumed from its last checkpoint for one more step: the same tracker runs go on
    train(path, steps=STEPS + 1)
    check_mlflow_resumed(stack, run, mlflow_uri, mlflow_run_id)
    check_wandb_resumed(stack, run, wandb_dir, wandb_run_id)


def check_mlflow_run(stack: LocalStack, run: str, uri: str, tmp_path: Path) -> str:
    """The MLflow run of `run`: its steps, evals, config and files; returns its id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run_id = tracker_entry(stack, run, "mlflow")["run_id"]
    found = client.get_run(run_id)
    assert found.info.status == "FINISHED" and found.info.run_name == run
    assert client.get_experiment(found.info.experiment_id).name == "trackers-test"
    # every step's numbers, at their steps, equal to metrics.jsonl's
    steps = events(stack, run, "step")
    history = client.get_metric_history(run_id, "step/reward_mean")
    assert [(m.step, m.value) for m in history] == pytest.approx(
        [(s["step"], s["reward_mean"]) for s in steps])
    for name in ("solve_rate_sampled", "mean_turns", "version", "rollout_s", "update_s",
                 "batch_max_staleness_seen"):
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, f"step/{name}")
                ] == pytest.approx([(s["step"], s[name]) for s in steps]), name
    evals = events(stack, run, "eval")
    assert [m.step for m in client.get_metric_history(run_id, "eval/eval/solve_rate")] == \
        [e["step"] for e in evals] == [0, STEPS]
    # the resolved config as parameters
    params = found.data.params
    assert params["run"] == run and params["steps"] == str(STEPS)
    assert params["mlflow.tracking_uri"] == uri and float(params["optim.lr"]) > 0
    # the learning curve and the summary, as files of the run
    assert {f.path for f in client.list_artifacts(run_id)} >= {"learning_curve.png",
                                                               "summary.json"}
    summary = json.loads(Path(client.download_artifacts(run_id, "summary.json",
                                                        str(tmp_path))).read_text())
    assert summary["event"] == "end" and summary["step"] == STEPS
    return run_id


def check_mlflow_resumed(stack: LocalStack, run: str, uri: str, run_id: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    assert tracker_entry(stack, run, "mlflow")["run_id"] == run_id
    history = client.get_metric_history(run_id, "step/reward_mean")
    assert sorted({m.step for m in history}) == [1, 2, 3]
    experiment = client.get_run(run_id).info.experiment_id
    runs = client.search_runs([experiment])
    assert [r.info.run_id for r in runs] == [run_id]  # no second run for the restart
    assert client.get_run(run_id).info.status == "FINISHED"


def wandb_records(run_file: Path) -> list[dict]:
    """The records of an offline run's .wandb file, read by wandb's own reader."""
    wandb = Path(sys.executable).with_name("wandb")
    out = subprocess.run([str(wandb), "leet", "inspect", "--json", str(run_file)],
                         capture_output=True, text=True, timeout=scaled(120), check=True,
                         env={**os.environ, "WANDB_SILENT": "true"})
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def check_wandb_offline_run(stack: LocalStack, run: str, wandb_dir: Path) -> str:
    """The offline W&B run of `run`: its header, config, steps, evals and files; returns
    its id."""
    run_id = tracker_entry(stack, run, "wandb")["run_id"]
    first = sorted(wandb_dir.glob(f"wandb/offline-run-*-{run_id}"))
    assert len(first) == 1
    records = wandb_records(first[0] / f"run-{run_id}.wandb")
    header = next(r["run"] for r in records if r["type"] == "run")
    assert header["run_id"] == run_id and header["project"] == "trackers-test"
    assert header["display_name"] == run
    config_update = {k: v for r in records if r["type"] == "config"
                     for k, v in r["config"]["update"].items()}
    assert config_update["steps"] == STEPS and config_update["run"] == run  # the config
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    steps = events(stack, run, "step")
    logged = {h["learner_step"]: h["step/reward_mean"] for h in history
              if "step/reward_mean" in h}
    assert logged == pytest.approx({s["step"]: s["reward_mean"] for s in steps})
    assert sorted(h["learner_step"] for h in history if "eval/eval/solve_rate" in h) == \
        [0, STEPS]
    files = first[0] / "files"
    assert json.loads((files / "summary.json").read_text())["step"] == STEPS
    assert (files / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    return run_id


def check_wandb_resumed(stack: LocalStack, run: str, wandb_dir: Path, run_id: str) -> None:
    # the same W&B run id (wandb writes each attempt's offline file apart)
    assert tracker_entry(stack, run, "wandb")["run_id"] == run_id
    attempts = sorted(wandb_dir.glob("wandb/offline-run-*"))
    assert len(attempts) == 2 and all(p.name.endswith(f"-{run_id}") for p in attempts)
    second = wandb_records(attempts[1] / f"run-{run_id}.wandb")
    assert next(r["run"] for r in second if r["type"] == "run")["run_id"] == run_id
    assert [r["history"]["item"]["learner_step"] for r in second if r["type"] == "history"
            and "step/reward_mean" in r["history"]["item"]] == [3]


def test_a_tracking_server_killed_mid_run_does_not_stop_training(
        stack: LocalStack, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = "killed-tracker"
    server, uri = start_mlflow(stack.group, tmp_path, name="mlflow-killed")
    steps = 4
    path = config(stack, tmp_path, run, steps=steps, eval=factories.NO_EVAL,
                  report_to=["mlflow"], mlflow={"tracking_uri": uri})
    proc = learner_process(path, resume="auto")
    client = MlflowClient(uri)

    def first_step_tracked() -> bool:
        assert proc.poll() is None, "the learner ended before its first step was tracked"
        run_id = tracker_entry(stack, run, "mlflow")["run_id"]
        return bool(client.get_metric_history(run_id, "step/reward_mean"))

    wait_until("step 1 in MLflow", first_step_tracked, timeout_s=600, period_s=0.5)
    stack.group.kill(server)  # the tracking server is gone for good
    out, _ = proc.communicate(timeout=scaled(900))
    assert proc.returncode == 0, out
    # every step trained and recorded in metrics.jsonl after the tracker died
    assert [s["step"] for s in events(stack, run, "step")] == list(range(1, steps + 1))
    assert events(stack, run, "end")
    # said once when it failed, then counted at the end; nothing else about it
    tracker_lines = [json.loads(line)["msg"] for line in out.splitlines()
                     if line.startswith("{") and "tracker mlflow" in line]
    assert len(tracker_lines) == 2, out
    assert "tracker mlflow failed" in tracker_lines[0]
    assert "not delivered" in tracker_lines[1]
    assert "Retrying" not in out  # the client's own retry warnings stay off the log
