"""rlfleet.storage.checkpoints: complete-only, deterministic, bit-identical resumption."""

from __future__ import annotations

import errno
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rlfleet.storage.atomic import DestinationExists, StorageError
from rlfleet.storage.checkpoints import (
    ADAPTER_WEIGHTS_FILE,
    COMPLETE_FILE,
    CheckpointError,
    RngState,
    capture_rng,
    latest_complete_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    restore_rng,
    save_checkpoint,
)
from rlfleet.storage.paths import RunsRoot


@pytest.fixture
def rr(tmp_path: Path) -> RunsRoot:
    return RunsRoot(tmp_path / "runs")


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"layer.lora_B": torch.zeros(8, 2), "layer.lora_A": torch.randn(2, 8, generator=g)}


def _save(rr: RunsRoot, step: int, **kw: object) -> Path:
    args: dict[str, object] = dict(adapter_state=_state(), optimizer_state={"state": {},
                                   "param_groups": []}, data_cursor={"next_seed": step})
    args.update(kw)
    return save_checkpoint(rr, "exp", step, **args)  # type: ignore[arg-type]


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_round_trip_reproduces_draws() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # leaves a cached gauss in numpy's state
    state = capture_rng()
    expected = [_draws() for _ in range(3)]
    restored = RngState.from_json_bytes(state.to_json_bytes())
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng(restored)
    assert [_draws() for _ in range(3)] == expected


def test_rng_json_malformed() -> None:
    with pytest.raises(CheckpointError):
        RngState.from_json_bytes(b'{"python": {}}')


def test_save_load_round_trip(rr: RunsRoot) -> None:
    path = _save(rr, 40, metrics={"reward_mean": 0.5}, scheduler_state={"last_epoch": 40},
                 data_cursor={"next_seed": 1234, "epoch": 0})
    assert path == rr.checkpoint_dir("exp", 40)
    ck = load_checkpoint(path)
    assert ck.step == 40 and ck.run == "exp"
    assert ck.metrics == {"reward_mean": 0.5}
    assert ck.data_cursor == {"next_seed": 1234, "epoch": 0}
    assert ck.scheduler_state == {"last_epoch": 40}
    assert set(ck.adapter_state) == {"layer.lora_A", "layer.lora_B"}
    assert all(torch.equal(ck.adapter_state[k], v) for k, v in _state().items())
    assert sorted(os.listdir(rr.checkpoints_root("exp"))) == ["step_000040"]
    with pytest.raises(DestinationExists):
        _save(rr, 40)


def test_adapter_bytes_deterministic(rr: RunsRoot) -> None:
    s = _state()
    reordered = dict(reversed(list(s.items())))
    a = save_checkpoint(rr, "exp", 1, adapter_state=s, optimizer_state={},
                        data_cursor={}, created_unix=1.0)
    b = save_checkpoint(rr, "exp", 2, adapter_state=reordered, optimizer_state={},
                        data_cursor={}, created_unix=2.0)
    assert (a / ADAPTER_WEIGHTS_FILE).read_bytes() == (b / ADAPTER_WEIGHTS_FILE).read_bytes()


def test_incomplete_never_latest(rr: RunsRoot) -> None:
    _save(rr, 10)
    _save(rr, 20)
    # A checkpoint dir without COMPLETE (e.g. written by a tool that crashed) ...
    p30 = rr.checkpoint_dir("exp", 30)
    p30.mkdir()
    (p30 / ADAPTER_WEIGHTS_FILE).write_bytes(b"half")
    # ... one whose marker is garbage, and a crashed atomic write.
    p40 = rr.checkpoint_dir("exp", 40)
    p40.mkdir()
    (p40 / COMPLETE_FILE).write_bytes(b"{not json")
    (rr.checkpoints_root("exp") / ".step_000050.tmp-1-abc").mkdir()
    assert list_checkpoints(rr, "exp") == [10, 20]
    assert latest_complete_checkpoint(rr, "exp") == rr.checkpoint_dir("exp", 20)
    with pytest.raises(CheckpointError, match="COMPLETE"):
        load_checkpoint(p30)
    assert latest_complete_checkpoint(rr, "other") is None


def test_crash_mid_save_leaves_nothing(rr: RunsRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    _save(rr, 10)
    real_fsync = os.fsync
    calls = {"n": 0}

    def fsync_then_fail(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_then_fail)
    with pytest.raises(StorageError) as info:
        _save(rr, 20)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert sorted(os.listdir(rr.checkpoints_root("exp"))) == ["step_000010"]
    assert latest_complete_checkpoint(rr, "exp") == rr.checkpoint_dir("exp", 10)


def test_unserialisable_cursor_writes_nothing(rr: RunsRoot) -> None:
    with pytest.raises(ValueError, match="data_cursor"):
        _save(rr, 10, data_cursor={"x": object()})
    assert list_checkpoints(rr, "exp") == []


def test_tampered_checkpoint_refused(rr: RunsRoot) -> None:
    path = _save(rr, 10)
    cursor = path / "data_cursor.json"
    cursor.write_text(json.dumps({"next_seed": 0}))
    with pytest.raises(CheckpointError, match="does not match"):
        load_checkpoint(path)
    assert load_checkpoint(path, verify=False).data_cursor == {"next_seed": 0}
    (path / "extra").write_bytes(b"")
    with pytest.raises(CheckpointError, match="listed"):
        load_checkpoint(path)


def test_prune(rr: RunsRoot) -> None:
    for s in (10, 20, 30, 40, 50):
        _save(rr, s)
    assert prune_checkpoints(rr, "exp", keep_last=2, keep={20}) == [10, 30]
    assert list_checkpoints(rr, "exp") == [20, 40, 50]
    with pytest.raises(ValueError):
        prune_checkpoints(rr, "exp", keep_last=0)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.drop = torch.nn.Dropout(0.3)  # consumes torch RNG every step
        self.fc2 = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def _make(seed: int) -> tuple[_Net, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    net = _Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return net, opt, sched


def _train(net: _Net, opt: torch.optim.Optimizer, sched: object, cursor: dict[str, int],
           steps: int) -> list[torch.Tensor]:
    losses = []
    for _ in range(steps):
        # Data depends on all three RNGs and on the cursor, as a real data loader would.
        n = 4 + random.randrange(4)
        noise = float(np.random.standard_normal())
        g = torch.Generator().manual_seed(cursor["next_seed"])
        x = torch.randn(n, 6, generator=g) + torch.randn(n, 6) * 0.1
        y = x.sum(dim=1, keepdim=True) + noise
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()  # type: ignore[attr-defined]
        cursor["next_seed"] += 1
        losses.append(loss.detach().clone())
    return losses


def test_resume_is_bit_identical(rr: RunsRoot) -> None:
    random.seed(0)
    np.random.seed(0)
    net, opt, sched = _make(0)
    cursor = {"next_seed": 100}
    _train(net, opt, sched, cursor, 5)
    path = save_checkpoint(rr, "exp", 5, adapter_state=net.state_dict(),
                           optimizer_state=opt.state_dict(),
                           scheduler_state=sched.state_dict(), data_cursor=cursor)
    expected_losses = _train(net, opt, sched, cursor, 6)
    expected = {k: v.clone() for k, v in net.state_dict().items()}

    # A fresh process: different init, RNGs elsewhere.
    random.seed(123)
    np.random.seed(123)
    net2, opt2, sched2 = _make(7)
    ck = load_checkpoint(latest_complete_checkpoint(rr, "exp") or path)
    net2.load_state_dict(ck.adapter_state)
    opt2.load_state_dict(ck.optimizer_state)
    assert ck.scheduler_state is not None
    sched2.load_state_dict(ck.scheduler_state)
    restore_rng(ck.rng)  # last: model/optimizer construction drew random numbers
    cursor2 = dict(ck.data_cursor)
    losses = _train(net2, opt2, sched2, cursor2, 6)

    assert cursor2 == cursor
    assert all(torch.equal(a, b) for a, b in zip(losses, expected_losses, strict=True))
    for k, v in net2.state_dict().items():
        assert torch.equal(v, expected[k]), k
    assert sched2.get_last_lr() == sched.get_last_lr()
