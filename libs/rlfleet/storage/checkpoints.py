"""Training checkpoints under `<run>/checkpoints/step_000040/`.

A checkpoint holds what the learner needs to continue bit-identically: the adapter weights
(safetensors, sorted keys, fixed metadata, so the same state gives the same bytes), the
optimizer and LR-scheduler state dicts (torch.save, loaded back with weights_only=True),
the RNG states of python `random`, numpy and torch (CPU, and CUDA when present) as JSON,
the data cursor (JSON) and step + metrics (JSON). `COMPLETE` is written last, after every
other file is fsynced, and lists each file's sha256; a dir without it is never used.
The whole dir is also published with `atomic_dir`, so a crash leaves only a temp dir.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import pickle
import random
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from rlfleet.storage.adapter_versions import ADAPTER_WEIGHTS_FILE, sha256_of
from rlfleet.storage.atomic import (
    atomic_dir,
    fsync_dir,
    remove_dir_atomic,
    write_file,
)
from rlfleet.storage.paths import (
    CHECKPOINT_COMPLETE_FILE,
    CHECKPOINT_CURSOR_FILE,
    RunsRoot,
    parse_step_dirname,
)

log = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng.json"
DATA_CURSOR_FILE = CHECKPOINT_CURSOR_FILE
STATE_FILE = "state.json"
# What the adapter was trained on: the base model's identity, the LoRA settings and the
# task settings that shape it; a resume compares it with its own config
# (rlfleet_learner.identity). Checkpoints written before it was recorded have none.
IDENTITY_FILE = "identity.json"
COMPLETE_FILE = CHECKPOINT_COMPLETE_FILE
CHECKPOINT_FORMAT_VERSION = 1
_FIXED_METADATA = {"format": "pt"}  # no timestamps: identical state -> identical bytes


class CheckpointError(ValueError):
    """A checkpoint dir is incomplete, corrupt or not a checkpoint."""


# -- RNG --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RngState:
    """RNG states of python `random`, numpy's global generator and torch (CPU + CUDA)."""

    python: tuple[Any, ...]
    numpy: dict[str, Any]
    torch_cpu: bytes
    torch_cuda: tuple[bytes, ...] = ()

    def to_json_bytes(self) -> bytes:
        version, internal, gauss_next = self.python
        np_state = self.numpy
        doc = {
            "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
            "numpy": {
                "bit_generator": np_state["bit_generator"],
                "key": [int(x) for x in np_state["state"]["key"]],
                "pos": int(np_state["state"]["pos"]),
                "has_gauss": int(np_state["has_gauss"]),
                "gauss": float(np_state["gauss"]),
            },
            "torch_cpu": base64.b64encode(self.torch_cpu).decode("ascii"),
            "torch_cuda": [base64.b64encode(s).decode("ascii") for s in self.torch_cuda],
        }
        return (json.dumps(doc, sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_json_bytes(cls, data: bytes) -> RngState:
        try:
            doc = json.loads(data.decode("utf-8"))
            py = doc["python"]
            npd = doc["numpy"]
            return cls(
                python=(int(py["version"]), tuple(int(x) for x in py["state"]),
                        py["gauss_next"]),
                numpy={
                    "bit_generator": str(npd["bit_generator"]),
                    "state": {"key": np.array(npd["key"], dtype=np.uint32),
                              "pos": int(npd["pos"])},
                    "has_gauss": int(npd["has_gauss"]),
                    "gauss": float(npd["gauss"]),
                },
                torch_cpu=base64.b64decode(doc["torch_cpu"], validate=True),
                torch_cuda=tuple(base64.b64decode(s, validate=True)
                                 for s in doc.get("torch_cuda", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{RNG_FILE} is malformed: {exc}") from exc


def capture_rng() -> RngState:
    """The current global RNG states (python, numpy, torch CPU, every CUDA device)."""
    cuda: tuple[bytes, ...] = ()
    if torch.cuda.is_available():
        cuda = tuple(bytes(s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all())
    return RngState(
        python=random.getstate(),
        numpy=np.random.get_state(legacy=False),
        torch_cpu=bytes(torch.get_rng_state().numpy().tobytes()),
        torch_cuda=cuda,
    )


def restore_rng(state: RngState) -> None:
    """Sets the global RNG states. Call it *after* building the model and optimizer
    (their init draws random numbers), just before training continues.

    CUDA states are restored only when the same number of devices is visible; otherwise
    they are skipped with a warning (CPU/python/numpy states are still restored)."""
    random.setstate(state.python)
    np.random.set_state(state.numpy)
    torch.set_rng_state(torch.frombuffer(bytearray(state.torch_cpu), dtype=torch.uint8))
    if state.torch_cuda:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(state.torch_cuda):
            torch.cuda.set_rng_state_all(
                [torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in state.torch_cuda])
        else:
            log.warning("checkpoint has CUDA RNG states for %d devices; not restored here",
                        len(state.torch_cuda))


# -- checkpoint -------------------------------------------------------------------------


@dataclass
class Checkpoint:
    path: Path
    run: str
    step: int
    adapter_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    scheduler_state: dict[str, Any] | None
    rng: RngState
    data_cursor: dict[str, Any]
    metrics: dict[str, Any]
    created_unix: float
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256
    identity: dict[str, Any] | None = None  # IDENTITY_FILE's, None when not recorded


def adapter_state_bytes(adapter_state: Mapping[str, torch.Tensor]) -> bytes:
    """Deterministic safetensors bytes: sorted keys, CPU contiguous copies, fixed metadata."""
    tensors = {k: adapter_state[k].detach().to("cpu").contiguous().clone()
               for k in sorted(adapter_state)}
    return safetensors.torch.save(tensors, metadata=dict(_FIXED_METADATA))


def _torch_bytes(state: Mapping[str, Any]) -> bytes:
    # Serialised in memory, then written with write_file: torch.save on a path reports a
    # full disk as a RuntimeError; this way OS errors stay OSErrors (-> StorageError).
    buf = io.BytesIO()
    torch.save(dict(state), buf)
    return buf.getvalue()


def _json_bytes(obj: Any, what: str) -> bytes:
    try:
        return (json.dumps(obj, sort_keys=True, allow_nan=True) + "\n").encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from exc


def save_checkpoint(
    runs_root: RunsRoot,
    run: str,
    step: int,
    *,
    adapter_state: Mapping[str, torch.Tensor],
    optimizer_state: Mapping[str, Any],
    data_cursor: Mapping[str, Any],
    scheduler_state: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    rng: RngState | None = None,
    created_unix: float | None = None,
    identity: Mapping[str, Any] | None = None,
) -> Path:
    """Writes `<run>/checkpoints/step_<step>/` atomically, COMPLETE last; returns its path.

    `rng` defaults to `capture_rng()` now; `identity` (what the adapter was trained on)
    goes to IDENTITY_FILE when given. Raises DestinationExists when the step is
    already checkpointed, StorageError for OS failures (nothing is left under the name),
    ValueError for state that cannot be serialised.
    """
    final = runs_root.checkpoint_dir(run, step)
    # Serialise what can fail on bad input before touching the disk.
    adapter_bytes = adapter_state_bytes(adapter_state)
    cursor_bytes = _json_bytes(dict(data_cursor), "data_cursor")
    optimizer_bytes = _torch_bytes(optimizer_state)
    scheduler_bytes = None if scheduler_state is None else _torch_bytes(scheduler_state)
    rng_bytes = (rng if rng is not None else capture_rng()).to_json_bytes()
    identity_bytes = None if identity is None else _json_bytes(dict(identity), "identity")
    state_bytes = _json_bytes({
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "run": run,
        "step": step,
        "metrics": dict(metrics or {}),
        "created_unix": float(time.time() if created_unix is None else created_unix),
    }, "metrics")

    with atomic_dir(final) as tmp:
        write_file(tmp, ADAPTER_WEIGHTS_FILE, adapter_bytes)
        write_file(tmp, OPTIMIZER_FILE, optimizer_bytes)
        if scheduler_bytes is not None:
            write_file(tmp, SCHEDULER_FILE, scheduler_bytes)
        write_file(tmp, RNG_FILE, rng_bytes)
        write_file(tmp, DATA_CURSOR_FILE, cursor_bytes)
        write_file(tmp, STATE_FILE, state_bytes)
        if identity_bytes is not None:
            write_file(tmp, IDENTITY_FILE, identity_bytes)
        fsync_dir(tmp)
        files = {}
        for name in sorted(os.listdir(tmp)):
            sha, size = sha256_of(tmp / name)
            files[name] = {"sha256": sha, "size": size}
        # Last, after everything above is durable: its presence means "all of it is there".
        write_file(tmp, COMPLETE_FILE, _json_bytes(
            {"format_version": CHECKPOINT_FORMAT_VERSION, "step": step, "files": files},
            "COMPLETE"))
    return final


def _read_complete(path: Path) -> dict[str, Any] | None:
    """The parsed COMPLETE marker, or None when absent/unreadable/malformed."""
    try:
        doc = json.loads((path / COMPLETE_FILE).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        return None
    return doc


def is_complete_checkpoint(path: Path) -> bool:
    """Whether `path` has a well-formed COMPLETE marker for the step its name says."""
    step = parse_step_dirname(Path(path).name)
    doc = _read_complete(Path(path))
    return doc is not None and (step is None or doc.get("step") == step)


def load_checkpoint(
    path: Path | str,
    *,
    verify: bool = True,
    map_location: str | torch.device = "cpu",
) -> Checkpoint:
    """Reads a checkpoint. Refuses (CheckpointError) one without COMPLETE and, with
    `verify`, one whose files do not match the sha256s COMPLETE lists. Has no side
    effects: call `restore_rng(ckpt.rng)` once the model and optimizer are rebuilt."""
    path = Path(path)
    doc = _read_complete(path)
    if doc is None:
        raise CheckpointError(f"{path} has no valid {COMPLETE_FILE} marker; not a complete "
                              "checkpoint")
    listed: dict[str, Any] = doc["files"]
    if verify:
        present = {n for n in os.listdir(path) if n != COMPLETE_FILE}
        if present != set(listed):
            raise CheckpointError(f"{path}: files {sorted(present)} != listed "
                                  f"{sorted(listed)}")
        for name, want in listed.items():
            sha, size = sha256_of(path / name)
            if not isinstance(want, dict) or want.get("sha256") != sha \
                    or want.get("size") != size:
                raise CheckpointError(f"{path}: {name} does not match {COMPLETE_FILE}")
    try:
        state = json.loads((path / STATE_FILE).read_bytes())
        cursor = json.loads((path / DATA_CURSOR_FILE).read_bytes())
        rng = RngState.from_json_bytes((path / RNG_FILE).read_bytes())
        adapter = safetensors.torch.load_file(str(path / ADAPTER_WEIGHTS_FILE),
                                              device=str(map_location))
        optimizer_state = torch.load(path / OPTIMIZER_FILE, map_location=map_location,
                                     weights_only=True)
        identity = read_checkpoint_identity(path)
        scheduler_state = None
        if (path / SCHEDULER_FILE).exists():
            scheduler_state = torch.load(path / SCHEDULER_FILE, map_location=map_location,
                                         weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing {exc.filename}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: malformed JSON: {exc}") from exc
    return Checkpoint(
        path=path,
        run=str(state.get("run", "")),
        step=int(state["step"]),
        adapter_state=dict(adapter),
        optimizer_state=optimizer_state,
        scheduler_state=scheduler_state,
        rng=rng,
        data_cursor=cursor,
        metrics=dict(state.get("metrics", {})),
        created_unix=float(state.get("created_unix", 0.0)),
        files={n: str(w.get("sha256", "")) for n, w in listed.items() if isinstance(w, dict)},
        identity=identity,
    )


def read_checkpoint_identity(path: Path | str) -> dict[str, Any] | None:
    """What a checkpoint's adapter was trained on (IDENTITY_FILE), read alone and
    cheaply (no weights, no hashing); None for a checkpoint that did not record it.
    CheckpointError when the file is there but not a JSON object."""
    try:
        doc = json.loads((Path(path) / IDENTITY_FILE).read_bytes())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: {IDENTITY_FILE} is malformed: {exc}") from exc
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: {IDENTITY_FILE} is not a JSON object")
    return doc


def list_checkpoints(runs_root: RunsRoot, run: str) -> list[int]:
    """Steps with a complete checkpoint, ascending (dirs without COMPLETE are skipped)."""
    root = runs_root.checkpoints_root(run)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    steps = []
    for e in entries:
        step = parse_step_dirname(e.name)
        if step is not None and e.is_dir(follow_symlinks=False) \
                and is_complete_checkpoint(Path(e.path)):
            steps.append(step)
    return sorted(steps)


def latest_complete_checkpoint(runs_root: RunsRoot, run: str) -> Path | None:
    """The dir of the highest-step complete checkpoint of `run`, or None."""
    steps = list_checkpoints(runs_root, run)
    return runs_root.checkpoint_dir(run, steps[-1]) if steps else None


def prune_checkpoints(
    runs_root: RunsRoot,
    run: str,
    keep_last: int,
    *,
    keep: Collection[int] = (),
) -> list[int]:
    """Removes complete checkpoints older than the newest `keep_last` (>= 1), sparing
    steps in `keep`. Incomplete dirs are left alone. Returns the steps removed."""
    if keep_last < 1:
        raise ValueError("keep_last must be >= 1 (the latest checkpoint is always kept)")
    steps = list_checkpoints(runs_root, run)
    doomed = [s for s in steps[:-keep_last] if s not in keep]
    for s in doomed:
        remove_dir_atomic(runs_root.checkpoint_dir(run, s))
    return doomed


# -- resuming ---------------------------------------------------------------------------

DAMAGED_PREFIX = "damaged-"  # a checkpoint set aside: kept for inspection, never loaded


# How many set-aside checkpoints a run keeps: the newest few explain a failure; a run
# that keeps damaging its checkpoints (a failing disk) must not fill the volume with them.
KEEP_DAMAGED = 3


def set_aside_damaged(path: Path, keep: int = KEEP_DAMAGED) -> Path:
    """Renames a damaged checkpoint dir to `damaged-step_<n>-<unix>` next to it, so the
    step can be checkpointed again (a resumed run reaches it again) and the bytes stay
    for inspection; only the newest `keep` set-aside dirs are kept. Returns the new
    path."""
    path = Path(path)
    stamp = int(time.time())
    aside = path.parent / f"{DAMAGED_PREFIX}{path.name}-{stamp}"
    n = 1
    while aside.exists():  # the same step set aside twice within a second
        aside = path.parent / f"{DAMAGED_PREFIX}{path.name}-{stamp}.{n}"
        n += 1
    os.rename(path, aside)
    fsync_dir(path.parent)
    prune_damaged(path.parent, keep)
    return aside


def _damaged_order(name: str) -> tuple[float, str]:
    """When a set-aside dir was set aside (its `-<unix>[.n]` suffix; 0 if unreadable)."""
    stamp = name.rsplit("-", 1)[-1]
    whole, _, n = stamp.partition(".")
    try:
        return float(whole) + (int(n) if n else 0) * 1e-3, name
    except ValueError:
        return 0.0, name


def prune_damaged(checkpoints_root: Path, keep: int = KEEP_DAMAGED) -> list[str]:
    """Removes all but the newest `keep` (>= 1) set-aside checkpoints; their names."""
    if keep < 1:
        raise ValueError("keep must be >= 1 (the newest set-aside checkpoint is kept)")
    names = sorted((n for n in os.listdir(checkpoints_root) if n.startswith(DAMAGED_PREFIX)),
                   key=_damaged_order)
    doomed = names[:-keep]
    for name in doomed:
        remove_dir_atomic(checkpoints_root / name)
    return doomed


def load_latest_intact_checkpoint(runs_root: RunsRoot, run: str) -> Checkpoint | None:
    """The newest complete checkpoint of `run` whose files match their sha256s and load.
    A damaged newer one (a truncated optimizer.pt, a flipped byte) is set aside with a
    warning naming it and the one used instead. None when the run has no checkpoint;
    CheckpointError when it has some but every one is damaged."""
    steps = list_checkpoints(runs_root, run)
    damaged: list[str] = []
    for step in reversed(steps):
        path = runs_root.checkpoint_dir(run, step)
        try:
            ckpt = load_checkpoint(path)
        except (CheckpointError, OSError, RuntimeError, EOFError, ValueError,
                pickle.UnpicklingError) as exc:  # a sha256 mismatch, or bytes that fail to load
            aside = set_aside_damaged(path)
            damaged.append(path.name)
            log.warning("checkpoint %s is damaged (%s); set it aside as %s and trying the "
                        "next older one", path.name, exc, aside.name,
                        extra={"run": run, "step": step})
            continue
        if damaged:
            log.warning("resuming from %s, the newest intact checkpoint (damaged: %s)",
                        path.name, ", ".join(damaged), extra={"run": run, "step": step})
        return ckpt
    if damaged:
        raise CheckpointError(f"every checkpoint of run {run!r} is damaged "
                              f"({', '.join(damaged)}; set aside under "
                              f"{runs_root.checkpoints_root(run)})")
    return None


def has_checkpoints(runs_root: RunsRoot, run: str) -> bool:
    """Whether `run` has any checkpoint, complete, incomplete or set aside as damaged: a
    run that has trained before (a fresh start over it would mix two attempts)."""
    try:
        names = os.listdir(runs_root.checkpoints_root(run))
    except FileNotFoundError:
        return False
    return any(parse_step_dirname(n) is not None or n.startswith(DAMAGED_PREFIX)
               for n in names)

