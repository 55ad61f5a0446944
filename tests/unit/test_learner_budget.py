"""A run's time budget (rlfleet_learner.budget) and the schedule it plans (LRFactor):
hand-computed plans, and a horizon that a checkpoint of the scheduler keeps."""

from __future__ import annotations

import math

import pytest
import torch

from rlfleet_learner.budget import PLAN_AFTER_STEPS, plan_due, planned_steps
from rlfleet_learner.trainer import LRFactor


def test_a_plan_is_due_after_each_curve_point_or_a_few_steps() -> None:
    assert not plan_due(19, eval_every=20) and plan_due(20, eval_every=20)
    assert not plan_due(PLAN_AFTER_STEPS - 1, eval_every=0)
    assert plan_due(PLAN_AFTER_STEPS, eval_every=0)


def test_planned_steps_fit_the_budget_left_at_the_recent_pace() -> None:
    # at step 20, 60 s of 600 spent, 3 s a step: 540 s left hold 180 more
    assert planned_steps(20, 3.0, 60.0, 600.0, max_steps=1000) == 200
    # later, faster: at step 100, 400 s spent, 2 s a step: 200 s hold 100 more
    assert planned_steps(100, 2.0, 400.0, 600.0, max_steps=1000) == 200
    # 3.05 s a step: 539 s left hold 176.7 more, and a part step does not fit
    assert planned_steps(20, 3.05, 61.0, 600.0, max_steps=1000) == 196
    # never past the config's steps
    assert planned_steps(20, 3.0, 60.0, 600.0, max_steps=120) == 120
    # a budget already spent ends the run at the step it has reached
    assert planned_steps(20, 3.0, 700.0, 600.0, max_steps=1000) == 20
    # no measurable pace: the config's steps
    assert planned_steps(20, 0.0, 60.0, 600.0, max_steps=120) == 120


@pytest.mark.parametrize("bad", [(20, -1.0, 60.0, 600.0), (20, 3.0, -1.0, 600.0),
                                 (20, 3.0, 60.0, 0.0)])
def test_planned_steps_refuse_what_is_not_a_budget(bad: tuple) -> None:
    with pytest.raises(ValueError):
        planned_steps(*bad, max_steps=100)


def test_the_lr_factor_warms_up_then_decays_to_zero_at_its_horizon() -> None:
    f = LRFactor(warmup=2, horizon=12, cosine=True)
    assert [f(0), f(1)] == [0.5, 1.0]
    assert f(2) == 1.0
    assert f(7) == pytest.approx(0.5)  # half way from 2 to 12: cos(pi/2)
    assert f(12) == pytest.approx(0.0) and f(20) == pytest.approx(0.0)
    f.horizon = 22  # a budget's plan moves the end
    assert f(12) == pytest.approx(0.5)
    assert LRFactor(warmup=0, horizon=12, cosine=False)(11) == 1.0


def test_a_scheduler_checkpoint_keeps_the_planned_horizon() -> None:
    params = [torch.nn.Parameter(torch.zeros(1))]
    optimizer = torch.optim.SGD(params, lr=1.0)
    factor = LRFactor(warmup=0, horizon=100, cosine=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    factor.horizon = 10
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()

    optimizer2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    factor2 = LRFactor(warmup=0, horizon=100, cosine=True)
    scheduler2 = torch.optim.lr_scheduler.LambdaLR(optimizer2, factor2)
    scheduler2.load_state_dict(state)
    assert factor2.horizon == 10
    optimizer2.step()
    scheduler2.step()
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.6)))
