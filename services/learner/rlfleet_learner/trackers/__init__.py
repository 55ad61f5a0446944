"""Experiment trackers the learner reports to, chosen by name in its config's `report_to`
(rlfleet.learner_config.TRACKER_NAMES): tensorboard, wandb, mlflow.

Each is fed by `TrackerHub` from the one place that writes metrics.jsonl (the learner's
`_event`), off the training thread (`TrackerSink`): the same numbers in every tracker,
and none of them can stop or slow training.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from rlfleet.registries import Registry
from rlfleet_learner.trackers.base import Tracker


def _is_tracker_class(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, Tracker)


def _tracker_class(module: str, name: str) -> Callable[[], type[Tracker]]:
    # imported when chosen: the tracker modules import their packages only when opened
    return lambda: getattr(import_module(f"rlfleet_learner.trackers.{module}"), name)


TRACKERS: Registry[type[Tracker]] = Registry("tracker", is_kind=_is_tracker_class,
                                             name_of=lambda cls: cls.name)
TRACKERS.add("tensorboard", _tracker_class("tensorboard_tracker", "TensorBoardTracker"))
TRACKERS.add("wandb", _tracker_class("wandb_tracker", "WandbTracker"))
TRACKERS.add("mlflow", _tracker_class("mlflow_tracker", "MlflowTracker"))

__all__ = ["TRACKERS", "Tracker"]
