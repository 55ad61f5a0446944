"""SkyRL's environments in rlfleet's training loop: a real learner runs GRPO steps on
skyrl-gym's own `gsm8k_multi_turn` (a text environment from the installed skyrl-gym
package, not written by rlfleet), served by the env service, played by a real rollout
replica, scored through the reward contract, the dataset rows walked by the seed cursor.
(The tiny maze policy never writes "#### N", so every reward is 0 and GRPO drops the
groups as zero-variance: the steps run end to end, the update has nothing to learn.)"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from rlfleet.local.forkserver import popen
from rlfleet.local.metrics_jsonl import read_events
from rlfleet.local.stack import start_stack
from tests.factories import NO_EVAL, SFT, learner_config

pytestmark = pytest.mark.slow


def test_the_learner_trains_on_a_skyrl_gym_environment(tmp_path: Path, procs) -> None:
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
             "env_class": "gsm8k_multi_turn",
             "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
             "extra_info": {}} for a, b in ((40, 2), (1, 1), (3, 4), (5, 5))]
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = "skyrl-gsm8k"
    stack = start_stack(tmp_path, runs_root=tmp_path / "runs", run=run, model_dir=SFT,
                        replicas=1, group=procs, log=lambda *_: None,
                        env_args=["--skyrl-env", f"gsm8k_multi_turn={data}"])
    # size, cell_px and turn_margin stay as the maze config has them: the SkyRL task
    # ignores them (as the learner sends them for every task)
    path = learner_config(stack, tmp_path, run, steps=2, eval=NO_EVAL,
                          data={"task": "skyrl:gsm8k_multi_turn", "context": "full",
                                "max_turns": 2, "groups_per_step": 2, "group_size": 4},
                          checkpoint={"every": 1000}, ray={"num_workers": 1})
    learner = popen([sys.executable, "-m", "rlfleet.cli", "learner", "run", "--config",
                     str(path)], env={**os.environ, **stack.service_env})
    try:
        out, _ = learner.communicate(timeout=1200)
    finally:
        if learner.poll() is None:
            learner.send_signal(signal.SIGTERM)
            out, _ = learner.communicate(timeout=300)
    assert learner.returncode == 0, out[-4000:]
    steps = [e for e in read_events(stack.runs_root / run / "metrics.jsonl")
             if e["event"] == "step"]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["trajectories"] == 2 * 4
        assert s["reward_name"] == "task"
        assert 1 <= s["mean_turns"] <= 2  # the spec's cap on skyrl-gym's episode
        assert len(s["seeds"]) == 2 and s["batch_num_groups"] == 2
        assert s["batch_num_zero_variance_groups"] + s["batch_num_kept"] // 4 == 2
