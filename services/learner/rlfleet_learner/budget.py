"""A run's time budget (LearnerConfig.minutes): how many steps fit in it.

The plan is made after the first curve evaluation (or PLAN_AFTER_STEPS steps in a run
without them) and made again after each later one, from the pace of the steps since the
last plan, their curve evaluation included: the first steps are the slowest (the start
policy's episodes are the longest), so a plan from them alone would end the run minutes
early. Each plan moves the cosine schedule's end a little; the plan and the budget spent
travel in the checkpoint, so a resumed run goes on from both.
"""

from __future__ import annotations

PLAN_AFTER_STEPS = 5
# a checkpoint's data cursor keys: the step the run ends at, the budget seconds spent
PLANNED_STEPS_KEY = "planned_steps"
BUDGET_SPENT_KEY = "budget_spent_s"


def plan_due(steps_since_plan: int, eval_every: int) -> bool:
    """Whether the steps since the last plan (or the attempt's start), and the curve
    evaluation due after the last of them, show enough of the pace to plan again."""
    return steps_since_plan >= (eval_every or PLAN_AFTER_STEPS)


def planned_steps(step: int, seconds_per_step: float, spent_s: float, budget_s: float,
                  max_steps: int) -> int:
    """The step the run ends at: at `step`, with `spent_s` of the `budget_s` seconds
    spent, as many more steps as fit at `seconds_per_step`. At least `step` (a budget
    already spent ends the run now), at most `max_steps`."""
    if seconds_per_step < 0 or spent_s < 0 or budget_s <= 0:
        raise ValueError(f"{seconds_per_step} s a step, {spent_s} s spent of {budget_s} s: "
                         "not a budget")
    if seconds_per_step == 0:
        return max(step, max_steps)
    more = int(max(0.0, budget_s - spent_s) // seconds_per_step)
    return max(step, min(max_steps, step + more))
