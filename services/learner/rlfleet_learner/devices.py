"""What a trainer rank's device can run, checked where the rank runs (the driver sits on a
CPU-only Ray head, so it cannot see the GPUs), before the ranks meet: one clear error per
rank instead of a crash deep inside the first forward."""

from __future__ import annotations

import torch


class DeviceError(ValueError):
    """A rank's device cannot run what the config asks (names the numbers)."""


def check_device(device: str, dtype: str) -> torch.device:
    """The torch device a rank trains on; DeviceError if ``device`` is missing here or
    cannot compute in ``dtype``. Ray gives each GPU rank its GPU(s) through
    CUDA_VISIBLE_DEVICES, so ``cuda`` means the first visible one."""
    if device == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"model.device is cuda but this rank sees no CUDA device (torch "
                f"{torch.__version__}, built for CUDA {torch.version.cuda or 'none'}, "
                f"{torch.cuda.device_count()} visible)")
        torch.cuda.set_device(0)
        target = torch.device("cuda", 0)
        if dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
            major, minor = torch.cuda.get_device_capability(0)
            raise DeviceError(
                f"model.dtype bfloat16 on {torch.cuda.get_device_name(0)} (compute "
                f"capability {major}.{minor}): bfloat16 needs 8.0 or newer; use float16")
    elif device == "cpu":
        target = torch.device("cpu")
        if dtype == "float16":
            raise DeviceError("model.dtype float16 on device cpu: use float32 or bfloat16")
    else:
        raise DeviceError(f"model.device {device!r}: expected cpu or cuda")
    _try_matmul(target, dtype)
    return target


def _try_matmul(device: torch.device, dtype: str) -> None:
    """A small matmul with a backward, so a build that lacks the kernels fails here."""
    try:
        x = torch.ones(8, 8, device=device, dtype=getattr(torch, dtype), requires_grad=True)
        (x @ x).sum().backward()
    except (RuntimeError, NotImplementedError) as exc:
        raise DeviceError(f"model.dtype {dtype} cannot train on {device} here: {exc}") from exc
