"""A run's time budget (LearnerConfig.minutes): how many steps fit in it.

Planned once, from the pace of the steps trained so far, so that the cosine schedule has a
fixed end to decay to (re-planning as steps speed up would move it under the run's feet).
The pace is measured after the first curve evaluation, which makes it include the
evaluations' share; a run without them plans after PLAN_AFTER_STEPS steps.
"""

from __future__ import annotations

PLAN_AFTER_STEPS = 5
# the plan's key in a checkpoint's data cursor: a resumed run keeps it
PLANNED_STEPS_KEY = "planned_steps"


def plan_due(steps_done: int, eval_every: int) -> bool:
    """Whether an attempt that has trained `steps_done` steps (and run the curve
    evaluation due after the last of them) has seen enough of its pace to plan."""
    return steps_done >= (eval_every or PLAN_AFTER_STEPS)


def planned_steps(step: int, steps_done: int, elapsed_s: float, budget_s: float,
                  max_steps: int) -> int:
    """The step the run ends at: `steps_done` steps, the last of them `step`, took
    `elapsed_s` of the `budget_s` seconds; as many more as fit at that pace. At least
    `step` (a budget already spent ends the run now), at most `max_steps`."""
    if steps_done <= 0:
        raise ValueError("the pace needs at least one step")
    if elapsed_s < 0 or budget_s <= 0:
        raise ValueError(f"elapsed {elapsed_s} s and budget {budget_s} s: not a pace")
    per_step = elapsed_s / steps_done
    if per_step == 0:
        return max(step, max_steps)
    more = int(max(0.0, budget_s - elapsed_s) // per_step)
    return max(step, min(max_steps, step + more))
