"""`report_to: [wandb]`: a Weights & Biases run, through the `wandb` package.

Project, entity, display name and mode come from the config's `wandb` section, else the
usual WANDB_PROJECT / WANDB_ENTITY / WANDB_NAME / WANDB_MODE (the key: WANDB_API_KEY);
the local files go under WANDB_DIR, else the run's directory. Offline mode writes the run
there without any network (`wandb sync` uploads it later). Every number is logged with
its learner step as the `learner_step` metric, the x-axis of every other one: W&B's own
step only grows, and a resumed learner logs again the steps after its checkpoint.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlfleet_learner.trackers.base import Outcome, Tracker

STEP_METRIC = "learner_step"
DEFAULT_PROJECT = "rlfleet"


class WandbTracker(Tracker):
    name = "wandb"

    def settings(self) -> dict[str, Any]:
        """wandb.init's arguments (the config's, else the environment's)."""
        w = self.cfg.wandb
        return {"project": w.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
                "entity": w.entity or os.environ.get("WANDB_ENTITY") or None,
                "name": w.name or os.environ.get("WANDB_NAME") or self.cfg.run,
                "mode": w.mode or os.environ.get("WANDB_MODE") or "online",
                "dir": os.environ.get("WANDB_DIR") or str(self.run_dir)}

    def open(self, resumed: Mapping[str, Any]) -> dict[str, Any]:
        import wandb

        run_id = resumed.get("run_id")
        # console off: the learner's output is its JSON log, not W&B's capture of it;
        # silent: nothing of wandb's own on the learner's output either.
        self._run = wandb.init(
            **self.settings(), id=run_id, resume="allow" if run_id else None,
            tags=["rlfleet"], settings=wandb.Settings(console="off", silent=True))
        self._run.define_metric(STEP_METRIC)
        self._run.define_metric("*", step_metric=STEP_METRIC)
        return {"run_id": self._run.id}

    def log_params(self, config: Mapping[str, Any]) -> None:
        # a resumed attempt may change a value (--steps): the newest config is the run's
        self._run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float], time: float | None
                    ) -> None:
        self._run.log({**metrics, STEP_METRIC: step})

    def log_files(self, paths: Sequence[Path]) -> None:
        # copied into the run's files directory: kept there, uploaded with the run
        files = Path(self._run.dir)
        for path in paths:
            shutil.copyfile(path, files / path.name)
            self._run.save(str(files / path.name), base_path=str(files), policy="now")

    def close(self, outcome: Outcome) -> None:
        self._run.finish(exit_code=0 if outcome == "finished" else 1)
