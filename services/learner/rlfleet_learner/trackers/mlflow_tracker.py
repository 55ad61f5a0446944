"""`report_to: [mlflow]`: an MLflow run on a tracking server, through MLflow's client.

The server is the config's `mlflow.tracking_uri`, else MLFLOW_TRACKING_URI (one of them
is required: a learner pod's own directory would lose the run); the experiment
`mlflow.experiment`, else MLFLOW_EXPERIMENT_NAME, else "rlfleet". The run is named after
the learner's run. Parameters are the resolved config's leaves as dotted keys; MLflow
keeps a parameter's first value, so a resumed run keeps its first attempt's (each
attempt's config is in metrics.jsonl's start event).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlfleet.config import ConfigError
from rlfleet.learner_config import LearnerConfig
from rlfleet_learner.trackers.base import Outcome, Tracker, flat_params

DEFAULT_EXPERIMENT = "rlfleet"
# MLflow's batch limits (log_batch): parameters and metrics a call
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
PARAM_VALUE_CHARS = 6000
STATUS = {"finished": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}
# MLflow's client retries a request for minutes by default; a tracker that does not answer
# is given up on sooner (its sink counts the loss and tries again later), and its client
# prints nothing on the learner's output (the run's URL goes to the log instead).
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
              "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
              "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
              "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, cfg: LearnerConfig, run_dir: Path) -> None:
        super().__init__(cfg, run_dir)
        self.tracking_uri = cfg.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not self.tracking_uri:
            raise ConfigError("report_to has mlflow but no tracking server: set "
                              "mlflow.tracking_uri or MLFLOW_TRACKING_URI")
        self.experiment = (cfg.mlflow.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                           or DEFAULT_EXPERIMENT)

    def open(self, resumed: Mapping[str, Any]) -> dict[str, Any]:
        for key, value in CLIENT_ENV.items():
            os.environ.setdefault(key, value)
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        run_id = resumed.get("run_id")
        if run_id:
            try:
                run = self._client.get_run(run_id)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                run = None  # another server (or a deleted run): a new run
            if run is not None:
                self._run_id = run.info.run_id
                self._client.update_run(self._run_id, status="RUNNING")
                self._params = dict(run.data.params)
                return {"run_id": self._run_id, "experiment_id": run.info.experiment_id}
        experiment_id = self._experiment_id(MlflowException)
        run = self._client.create_run(experiment_id, run_name=self.cfg.run,
                                      tags={"rlfleet.run": self.cfg.run})
        self._run_id = run.info.run_id
        self._params = {}
        return {"run_id": self._run_id, "experiment_id": experiment_id}

    def _experiment_id(self, error: type[Exception]) -> str:
        found = self._client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self._client.create_experiment(self.experiment)
        except error:  # another learner created it meanwhile
            found = self._client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def log_params(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        new = [Param(key, str(value)[:PARAM_VALUE_CHARS])
               for key, value in flat_params(config) if key not in self._params]
        for i in range(0, len(new), PARAMS_PER_BATCH):
            self._client.log_batch(self._run_id, params=new[i:i + PARAMS_PER_BATCH])
        self._params.update({p.key: p.value for p in new})

    def log_metrics(self, step: int, metrics: Mapping[str, float], time: float | None
                    ) -> None:
        import time as clock

        from mlflow.entities import Metric

        ms = int((time if time is not None else clock.time()) * 1000)
        batch = [Metric(key, value, ms, step) for key, value in metrics.items()]
        for i in range(0, len(batch), METRICS_PER_BATCH):
            self._client.log_batch(self._run_id, metrics=batch[i:i + METRICS_PER_BATCH])

    def log_files(self, paths: Sequence[Path]) -> None:
        for path in paths:
            self._client.log_artifact(self._run_id, str(path))

    def close(self, outcome: Outcome) -> None:
        self._client.set_terminated(self._run_id, STATUS[outcome])
