"""What a run's adapter is trained on, and the check that a resume continues the same
thing: the base model (its path and fingerprint), the LoRA settings and the task
settings that shape the adapter. A checkpoint records it (`identity.json`); a resume
with another one is refused before Ray starts, naming each difference, unless the
config's `resume_allow_changes` names the change's group (then the run's metrics.jsonl
records it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlfleet.learner_config import LearnerConfig
from rlfleet.policy.fingerprint import model_fingerprint
from rlfleet.storage import RunsRoot

GROUPS = ("model", "lora", "task")
# Changes no flag can allow: the checkpoint's adapter tensors have the old shapes.
SHAPED = ("lora.rank", "lora.modules")


class ResumeRefused(ValueError):
    """The checkpoint to resume was trained on another model, LoRA or task."""


@dataclass(frozen=True)
class Difference:
    group: str  # model, lora or task
    name: str  # e.g. lora.rank
    recorded: Any
    current: Any

    def __str__(self) -> str:
        return f"{self.name} {self.recorded} -> {self.current}"

    def as_dict(self) -> dict[str, Any]:
        return {"setting": self.name, "checkpoint": self.recorded, "now": self.current}


def run_identity(cfg: LearnerConfig, model_dir: str | Path) -> dict[str, Any]:
    """The identity a checkpoint of this config records."""
    m, d = cfg.model, cfg.data
    return {
        "model": {"path": str(m.path if m.path is not None else model_dir),
                  "profile": m.profile, "sha256": model_fingerprint(model_dir)},
        "lora": {"rank": m.lora_rank,
                 "alpha": m.lora_alpha if m.lora_alpha is not None else 2 * m.lora_rank,
                 "modules": sorted(m.lora_modules), "dropout": 0.0},
        "task": {"task": d.task, "size": d.size, "context": d.context},
    }


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[Difference]:
    """What differs between a checkpoint's identity and this config's. The model counts
    by its fingerprint (the same weights under another path are the same model)."""
    out: list[Difference] = []
    old_model, new_model = recorded.get("model") or {}, current["model"]
    if old_model.get("sha256") != new_model["sha256"]:
        out.append(Difference(
            "model", "model",
            f"{old_model.get('path', '?')} (sha256 {str(old_model.get('sha256', '?'))[:12]})",
            f"{new_model['path']} (sha256 {new_model['sha256'][:12]})"))
    for group in ("lora", "task"):
        old, new = recorded.get(group) or {}, current[group]
        for key, value in new.items():
            if key in old and old[key] != value:
                out.append(Difference(group, f"{group}.{key}", old[key], value))
    return out


def check_resume(recorded: dict[str, Any] | None, current: dict[str, Any],
                 allowed: tuple[str, ...] | list[str], checkpoint: str) -> list[Difference]:
    """The differences the config allows (to be recorded); ResumeRefused naming every
    difference when any is not allowed (or cannot be: the adapter's shapes). A
    checkpoint that recorded no identity is not checked (an empty list)."""
    if recorded is None:
        return []
    found = differences(recorded, current)
    refused = [d for d in found if d.group not in allowed or d.name in SHAPED]
    if not refused:
        return found
    groups = sorted({d.group for d in refused if d.name not in SHAPED})
    hint = (f"; if the change is meant, set resume_allow_changes: [{', '.join(groups)}]"
            if groups else "")
    shaped = [d.name for d in refused if d.name in SHAPED]
    if shaped:
        hint += (f"; {' and '.join(shaped)} cannot change on a resume (the checkpoint's "
                 "adapter tensors have its shapes): start a run of another name")
    raise ResumeRefused(
        f"checkpoint {checkpoint} was trained with other settings: "
        f"{'; '.join(str(d) for d in found)}{hint}")


def resume_checkpoint_dir(root: RunsRoot, run: str, resume: str) -> Path | None:
    """The checkpoint a `--resume` would continue from, found without loading it (the
    newest complete one for latest/auto), or None for a fresh start."""
    from rlfleet.storage import latest_complete_checkpoint

    if resume == "none":
        return None
    if resume in ("latest", "auto"):
        return latest_complete_checkpoint(root, run)
    return root.resolve(resume)


def check_before_start(cfg: LearnerConfig, resume: str, model_dir: str | Path) -> None:
    """Before Ray starts: ResumeRefused when the checkpoint to resume was trained on
    another model, LoRA or task than `cfg` (and the config does not allow it)."""
    from rlfleet.storage.checkpoints import read_checkpoint_identity

    root = RunsRoot(cfg.fleet.runs_root)
    path = resume_checkpoint_dir(root, cfg.run, resume)
    if path is None or not path.is_dir():
        return  # nothing to compare: the learner says what is missing
    check_resume(read_checkpoint_identity(path), run_identity(cfg, model_dir),
                 cfg.resume_allow_changes, path.name)
