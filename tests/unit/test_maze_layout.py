"""Explicit layouts (VisGym saved states, protobuf bytes) and their validation."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.maze import Layout, LayoutError, MazeEpisode, generate_layout, oracle_texts

OPEN_5 = [
    [1, 1, 1, 1, 1],
    [1, 0, 0, 0, 1],
    [1, 0, 1, 0, 1],
    [1, 0, 0, 0, 1],
    [1, 1, 1, 1, 1],
]


def test_bytes_round_trip() -> None:
    layout = generate_layout(11, 11)
    data = layout.to_bytes()
    assert len(data) == 121 and set(data) <= {0, 1}
    assert data[:11] == b"\x01" * 11  # row-major: the first row is the top wall
    again = Layout.from_bytes(11, 11, data, layout.agent, layout.target)
    assert again == layout and hash(again) == hash(layout)


def test_init_state_round_trip_and_replay() -> None:
    layout = generate_layout(4, 9)
    state = layout.to_init_state()
    assert set(state) == {"maze_map", "agent_location", "target_location"}
    replayed = Layout.from_init_state(state)
    assert replayed == layout
    episode = MazeEpisode(replayed, max_turns=20)
    for text in oracle_texts(replayed):
        outcome = episode.step(text)
    assert outcome.done and outcome.reward == 1.0


def test_explicit_non_perfect_map_allowed() -> None:
    layout = Layout.from_walls(OPEN_5, (1, 1), (3, 3))
    assert layout.height == 5 and layout.width == 5
    assert layout.walls.dtype == np.uint8
    assert not layout.walls.flags.writeable


def test_rectangular_map_allowed() -> None:
    walls = np.ones((5, 7), dtype=int)
    walls[1, 1:6] = 0
    layout = Layout.from_walls(walls, (1, 1), (1, 5))
    assert (layout.height, layout.width) == (5, 7)


@pytest.mark.parametrize(
    ("walls", "agent", "target", "message"),
    [
        ([[1, 1, 1], [1, 0, 1], [1, 1, 1]], (1, 1), (1, 1), "odd and between"),
        (np.ones((6, 5)), (1, 1), (3, 3), "height"),
        (np.ones((5, 5, 1)), (1, 1), (3, 3), "2-D"),
        ([[1, 1], [1]], (1, 1), (1, 1), "rectangular"),
        ([[0] + r[1:] for r in OPEN_5], (1, 1), (3, 3), "border"),
        ([r[:] for r in OPEN_5[:2]] + [[1, 0, 2, 0, 1]] + OPEN_5[3:], (1, 1), (3, 3), "0"),
        (OPEN_5, (2, 2), (3, 3), "agent .* wall"),
        (OPEN_5, (1, 1), (0, 0), "target .* wall"),
        (OPEN_5, (1, 1), (9, 9), "outside"),
        (OPEN_5, (1,), (3, 3), "pair"),
        (OPEN_5, (1.0, 1), (3, 3), "pair"),
        (
            [[1] * 5, [1, 0, 1, 0, 1], [1, 0, 1, 0, 1], [1, 0, 1, 0, 1], [1] * 5],
            (1, 1),
            (1, 3),
            "cannot be reached",
        ),
    ],
)
def test_invalid_layouts_rejected(walls, agent, target, message) -> None:  # noqa: ANN001
    with pytest.raises(LayoutError, match=message):
        Layout.from_walls(walls, agent, target)


def test_layout_error_is_value_error() -> None:
    assert issubclass(LayoutError, ValueError)


@pytest.mark.parametrize(
    ("height", "width", "data", "message"),
    [
        (5, 5, b"\x01" * 24, "25"),
        (4, 5, b"\x01" * 20, "height"),
        (5, 5, "x" * 25, "bytes"),
    ],
)
def test_bad_bytes_rejected(height, width, data, message) -> None:  # noqa: ANN001
    with pytest.raises(LayoutError, match=message):
        Layout.from_bytes(height, width, data, (1, 1), (3, 3))


def test_missing_init_state_keys() -> None:
    with pytest.raises(LayoutError, match="agent_location"):
        Layout.from_init_state({"maze_map": OPEN_5, "target_location": [3, 3]})
