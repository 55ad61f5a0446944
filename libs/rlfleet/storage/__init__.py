"""Everything that reads or writes the runs root (/shared/runs): paths with containment
checks, atomic directory writes, adapter versions and training checkpoints.

The checkpoint names are imported lazily: they need torch, which a service that only
publishes or verifies adapters (ckpt-sync) should not have to load.
"""

from typing import Any

from rlfleet.storage.adapter_versions import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    MANIFEST_FILE,
    AdapterManifest,
    AdapterVerificationError,
    FileEntry,
    VersionProtected,
    checkpoint_adapter_versions,
    latest_version,
    list_versions,
    manifest_sha256,
    prune_versions,
    publish_adapter_dir,
    read_manifest,
    remove_version,
    verify_adapter_dir,
)
from rlfleet.storage.atomic import (
    DestinationExists,
    StorageError,
    atomic_dir,
    clean_temp_dirs,
    is_transient,
    remove_dir_atomic,
    retry,
    write_dir_atomic,
)
from rlfleet.storage.paths import (
    InvalidRunName,
    PathOutsideRunsRoot,
    RunsRoot,
    default_runs_root,
    validate_run_name,
)

__all__ = [
    "ADAPTER_CONFIG_FILE", "ADAPTER_WEIGHTS_FILE", "MANIFEST_FILE",
    "AdapterManifest", "AdapterVerificationError", "FileEntry", "VersionProtected",
    "checkpoint_adapter_versions",
    "latest_version", "list_versions", "manifest_sha256", "prune_versions",
    "publish_adapter_dir", "read_manifest", "remove_version", "verify_adapter_dir",
    "DestinationExists", "StorageError", "atomic_dir", "clean_temp_dirs", "is_transient",
    "remove_dir_atomic", "retry", "write_dir_atomic",
    "Checkpoint", "CheckpointError", "RngState", "capture_rng", "is_complete_checkpoint",
    "latest_complete_checkpoint", "list_checkpoints", "load_checkpoint",
    "prune_checkpoints", "restore_rng", "save_checkpoint",
    "has_checkpoints", "load_latest_intact_checkpoint",
    "InvalidRunName", "PathOutsideRunsRoot", "RunsRoot", "default_runs_root",
    "validate_run_name",
]

_CHECKPOINT_NAMES = {
    "Checkpoint", "CheckpointError", "RngState", "capture_rng", "is_complete_checkpoint",
    "latest_complete_checkpoint", "list_checkpoints", "load_checkpoint",
    "prune_checkpoints", "restore_rng", "save_checkpoint",
    "has_checkpoints", "load_latest_intact_checkpoint",
}


def __getattr__(name: str) -> Any:
    if name in _CHECKPOINT_NAMES:
        from rlfleet.storage import checkpoints

        return getattr(checkpoints, name)
    raise AttributeError(f"module 'rlfleet.storage' has no attribute {name!r}")
