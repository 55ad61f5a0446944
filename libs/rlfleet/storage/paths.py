"""Paths under the runs root (/shared/runs), with containment checks.

Every path that a request names (a run, a version, a step) goes through `RunsRoot`, which
refuses anything that would land outside the root: absolute paths, `..`, symlinks that
point outside, NUL bytes, overlong names. Containment is checked on the realpath, so a
symlink planted inside the root cannot be used to escape it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from rlfleet import defaults

ENV_RUNS_ROOT = "RLFLEET_RUNS_ROOT"
DEFAULT_RUNS_ROOT = defaults.RUNS_ROOT

RUN_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
VERSION_DIR_RE = re.compile(r"v(\d{6,})")
STEP_DIR_RE = re.compile(r"step_(\d{6,})")

MAX_RELATIVE_BYTES = 1024  # far above any layout path; refuses garbage early
MAX_COMPONENT_BYTES = 255  # NAME_MAX on Linux filesystems
MAX_PATH_BYTES = 4096  # PATH_MAX

ADAPTERS_DIRNAME = "adapters"
CHECKPOINTS_DIRNAME = "checkpoints"
EVAL_DIRNAME = "eval"
# in a checkpoint dir: the marker written last, and the data cursor (with the adapter
# version served at that step); named here because ckpt-sync reads them without torch
CHECKPOINT_COMPLETE_FILE = "COMPLETE"
CHECKPOINT_CURSOR_FILE = "data_cursor.json"
METRICS_FILENAME = "metrics.jsonl"


class PathOutsideRunsRoot(ValueError):
    """A path named by a caller would resolve outside the runs root (or is malformed)."""


class InvalidRunName(ValueError):
    """A run name that is not `[A-Za-z0-9._-]{1,64}` (or is "." / "..")."""


def default_runs_root() -> Path:
    """`$RLFLEET_RUNS_ROOT` when set and non-empty, else /shared/runs."""
    value = os.environ.get(ENV_RUNS_ROOT, "").strip()
    return Path(value) if value else DEFAULT_RUNS_ROOT


def validate_run_name(run: str) -> str:
    """Returns `run` when it is a valid run name; raises InvalidRunName otherwise."""
    if not isinstance(run, str) or not RUN_NAME_RE.fullmatch(run) or run in (".", ".."):
        raise InvalidRunName(
            f"invalid run name {run!r}: expected 1-64 characters of [A-Za-z0-9._-], "
            "not '.' or '..'"
        )
    return run


def _check_index(kind: str, value: int) -> int:
    # bool is an int in Python; True as a version number is a caller bug.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{kind} must be a non-negative int, got {value!r}")
    return value


def version_dirname(version: int) -> str:
    return f"v{_check_index('version', version):06d}"


def step_dirname(step: int) -> str:
    return f"step_{_check_index('step', step):06d}"


def parse_version_dirname(name: str) -> int | None:
    """The version of a `v000042` directory name, or None for anything else (temp dirs)."""
    m = VERSION_DIR_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def parse_step_dirname(name: str) -> int | None:
    """The step of a `step_000040` directory name, or None for anything else."""
    m = STEP_DIR_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class RunsRoot:
    """The runs root and the layout below it.

    `root` defaults to `default_runs_root()`. It is stored as its realpath (the root itself
    may be a symlink, e.g. to a mount), so every path returned is canonical.
    """

    def __init__(self, root: Path | str | None = None) -> None:
        raw = Path(root) if root is not None else default_runs_root()
        if "\x00" in str(raw):
            raise ValueError("runs root contains a NUL byte")
        self.root = Path(os.path.realpath(raw))

    def __repr__(self) -> str:
        return f"RunsRoot({str(self.root)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunsRoot) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    def resolve(self, relative: str | os.PathLike[str]) -> Path:
        """The canonical path of `relative` under the root; refuses anything outside it.

        Raises PathOutsideRunsRoot for: a NUL byte, an absolute path, any `..` component,
        an overlong path or component, or a path whose realpath (symlinks followed) is not
        inside the root. The path need not exist.
        """
        rel = os.fspath(relative)
        if not isinstance(rel, str):
            raise PathOutsideRunsRoot(f"path must be text, got {type(rel).__name__}")
        shown = rel if len(rel) <= 200 else rel[:200] + "..."
        if "\x00" in rel:
            raise PathOutsideRunsRoot(f"path {shown!r} contains a NUL byte")
        if rel == "":
            raise PathOutsideRunsRoot("empty path")
        encoded = rel.encode("utf-8", "surrogateescape")
        if len(encoded) > MAX_RELATIVE_BYTES:
            raise PathOutsideRunsRoot(
                f"path {shown!r} is {len(encoded)} bytes, over the limit of {MAX_RELATIVE_BYTES}"
            )
        pure = PurePosixPath(rel)
        if pure.is_absolute() or rel.startswith(("/", "\\")):
            raise PathOutsideRunsRoot(f"path {shown!r} is absolute; expected one relative to "
                                      f"the runs root {self.root}")
        for part in pure.parts:
            if part == "..":
                raise PathOutsideRunsRoot(f"path {shown!r} contains '..'")
            if len(part.encode("utf-8", "surrogateescape")) > MAX_COMPONENT_BYTES:
                raise PathOutsideRunsRoot(
                    f"path {shown!r} has a component over {MAX_COMPONENT_BYTES} bytes"
                )
        # realpath follows every symlink that exists along the way; what remains must still
        # be inside the (canonical) root.
        real = os.path.realpath(os.path.join(self.root, rel))
        if not _is_within(real, str(self.root)):
            raise PathOutsideRunsRoot(
                f"path {shown!r} resolves to {real}, outside the runs root {self.root} "
                "(a symlink points outside)"
            )
        if len(real.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
            raise PathOutsideRunsRoot(f"path {shown!r} resolves to a path over {MAX_PATH_BYTES} "
                                      "bytes")
        return Path(real)

    # -- layout ----------------------------------------------------------------------

    def run_dir(self, run: str) -> Path:
        """`<root>/<run>`."""
        return self.resolve(validate_run_name(run))

    def adapters_root(self, run: str) -> Path:
        """`<root>/<run>/adapters`."""
        return self.resolve(f"{validate_run_name(run)}/{ADAPTERS_DIRNAME}")

    def adapter_dir(self, run: str, version: int) -> Path:
        """`<root>/<run>/adapters/v000042`."""
        return self.resolve(f"{validate_run_name(run)}/{ADAPTERS_DIRNAME}/"
                            f"{version_dirname(version)}")

    def checkpoints_root(self, run: str) -> Path:
        """`<root>/<run>/checkpoints`."""
        return self.resolve(f"{validate_run_name(run)}/{CHECKPOINTS_DIRNAME}")

    def checkpoint_dir(self, run: str, step: int) -> Path:
        """`<root>/<run>/checkpoints/step_000040`."""
        return self.resolve(f"{validate_run_name(run)}/{CHECKPOINTS_DIRNAME}/"
                            f"{step_dirname(step)}")

    def eval_dir(self, run: str, step: int | None = None) -> Path:
        """`<root>/<run>/eval`, or `<root>/<run>/eval/step_000040` for one step's results."""
        rel = f"{validate_run_name(run)}/{EVAL_DIRNAME}"
        if step is not None:
            rel += f"/{step_dirname(step)}"
        return self.resolve(rel)

    def metrics_path(self, run: str) -> Path:
        """`<root>/<run>/metrics.jsonl`."""
        return self.resolve(f"{validate_run_name(run)}/{METRICS_FILENAME}")

    def list_runs(self) -> list[str]:
        """Run directories directly under the root (valid names only), sorted."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        runs = []
        for e in entries:
            if RUN_NAME_RE.fullmatch(e.name) and e.name not in (".", "..") and e.is_dir(
                follow_symlinks=False
            ):
                runs.append(e.name)
        return sorted(runs)
