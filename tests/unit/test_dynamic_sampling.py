"""Dynamic sampling: a step draws groups until enough carry signal, within a limit; and a
run that draws no signal for several steps in a row is told so once."""

from __future__ import annotations

from types import SimpleNamespace

from rlfleet_learner.dynamic_sampling import NoSignalWatch, carries_signal, draw_groups


def group(*rewards: float) -> tuple:
    return (None, [SimpleNamespace(reward=r) for r in rewards])


SIGNAL, FLAT = group(1.0, 0.0), group(0.0, 0.0)


class Source:
    """Hands out the groups of `pattern` in order, recording each take."""

    def __init__(self, pattern: list[tuple]) -> None:
        self.pattern = pattern
        self.takes: list[tuple[int, int]] = []

    def __call__(self, first: int, count: int) -> list[tuple]:
        self.takes.append((first, count))
        return self.pattern[first:first + count]


def test_signal_means_unequal_rewards_in_a_group_of_two_or_more() -> None:
    assert carries_signal(SIGNAL) and carries_signal(group(0.5, 0.5, 0.25))
    assert not carries_signal(FLAT) and not carries_signal(group(1.0))


def test_without_a_limit_above_wanted_a_step_takes_what_it_drew() -> None:
    source = Source([FLAT, FLAT, SIGNAL, FLAT])
    assert draw_groups(source, wanted=4, limit=0) == source.pattern
    assert source.takes == [(0, 4)]


def test_refills_until_enough_groups_carry_signal() -> None:
    # 4 wanted; the first draw has 2 with signal (rate 1/2): the 2 missing need 4 more
    source = Source([SIGNAL, FLAT, SIGNAL, FLAT] + [FLAT, SIGNAL, SIGNAL, FLAT] + [SIGNAL] * 8)
    drawn = draw_groups(source, wanted=4, limit=32)
    assert source.takes == [(0, 4), (4, 4)]
    assert len(drawn) == 8 and sum(map(carries_signal, drawn)) == 4


def test_stops_at_the_limit() -> None:
    source = Source([FLAT] * 100)
    drawn = draw_groups(source, wanted=4, limit=12)
    assert len(drawn) == 12
    assert source.takes == [(0, 4), (4, 8)]  # no signal yet: 8x the missing, capped


def test_a_stop_while_drawing_returns_none() -> None:
    calls = iter([[SIGNAL, FLAT], None])
    assert draw_groups(lambda first, count: next(calls), wanted=2, limit=8) is None


def test_the_watch_speaks_once_after_enough_silent_steps() -> None:
    watch = NoSignalWatch(steps=3)
    assert watch.observe(1, [FLAT, FLAT]) is None
    assert watch.observe(2, [SIGNAL]) is None  # signal resets the count
    said = [watch.observe(step, [FLAT, FLAT]) for step in range(3, 9)]
    assert said[:2] == [None, None] and said[3:] == [None, None, None]
    assert "steps 3-5" in said[2] and "none of 6 rollout groups" in said[2]
