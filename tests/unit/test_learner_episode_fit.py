"""A learner config whose full-history episodes cannot fit the serving profile's
max_model_len is refused at start with the numbers; the shipped runs fit."""

from __future__ import annotations

import pytest

from rlfleet.learner_config import LearnerConfig
from rlfleet.policy import load_processor
from rlfleet_learner.episode_fit import check_episodes_fit, episode_turns


def cfg(**data) -> LearnerConfig:  # noqa: ANN003
    return LearnerConfig.model_validate({"data": data})


def test_runs_that_fit_start(tiny_model_dir) -> None:  # noqa: ANN001
    processor = load_processor(tiny_model_dir)
    check_episodes_fit(cfg(context="full", max_turns=15, size=7, cell_px=16), processor)
    check_episodes_fit(cfg(context="last_frame", max_new_tokens=3000), processor)
    assert episode_turns(cfg(context="last_frame", max_turns=15)) == 1
    assert episode_turns(cfg(context="full", max_turns=15)) == 15


def test_fifteen_turns_that_overflow_the_context_are_refused(tiny_model_dir) -> None:  # noqa: ANN001
    processor = load_processor(tiny_model_dir)
    # 7x7 at 16 px: 49 image tokens a frame; 15 turns of 256 new tokens overflow 4096
    with pytest.raises(ValueError, match=r"model.profile tiny: max_model_len 4096 cannot hold "
                                         r"15 turns: .* = \d+ tokens .*max_new_tokens=256"):
        check_episodes_fit(cfg(context="full", max_turns=15, size=7, cell_px=16,
                               max_new_tokens=256), processor)
