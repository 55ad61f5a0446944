"""One evaluation, for the learner and `rlfleet eval`: greedy play of fixed maze sets
through the rollout fleet (`play`), their summaries with standard errors and the bands
of shortest-path length (`summary`), the before/after table (`table`), and whether a
turn limit lets every eval maze be solved (`solvable`)."""
