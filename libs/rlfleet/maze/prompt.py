"""The words around the picture: the task instruction and the per-turn status line.

The instruction follows VisGym's maze_2d prompt (colours, action list, one action per
reply) and is written for the episode's action format, so a model is only ever shown the
format it is scored on.
"""

from __future__ import annotations

from rlfleet.maze.actions import ActionFormat


def instruction_text(height: int, width: int, action_format: ActionFormat | str) -> str:
    """What the model is asked to do, and how to write an action."""
    fmt = ActionFormat(action_format)
    head = (
        f"You are navigating a {height}x{width} maze. The maze consists of walls (gray) and "
        "paths (white). You are represented by a blue circle, and your goal is to reach the "
        "red target square, then stop there.\n\nAvailable actions:\n"
    )
    if fmt is ActionFormat.LITERAL:
        body = (
            "1. 'move': Move in one of four directions. Format: `('move', direction)` where "
            "direction is an integer:\n   - 0=right, 1=up, 2=left, 3=down\n"
            "2. 'stop': End the navigation session. Format: `('stop', 'stop')`\n\n"
            "Success: you succeed if you stop on the red target square.\n\n"
            "Please respond with exactly one action in the specified format. For example:\n"
            "- To move right: `('move', 0)`\n- To move up: `('move', 1)`\n"
            "- To move left: `('move', 2)`\n- To move down: `('move', 3)`\n"
            "- To stop: `('stop', 'stop')`"
        )
    else:
        body = (
            "1. Move one cell: right, up, left or down.\n"
            "2. stop: End the navigation session.\n\n"
            "Success: you succeed if you stop on the red target square.\n\n"
            "Please respond with exactly one action wrapped in action tags. For example:\n"
            "- To move right: <action>right</action>\n- To move up: <action>up</action>\n"
            "- To move left: <action>left</action>\n- To move down: <action>down</action>\n"
            "- To stop: <action>stop</action>"
        )
    return head + body


def status_text(feedback: str, turn: int, max_turns: int) -> str:
    """The last step's feedback and how many turns remain."""
    left = max(max_turns - turn, 0)
    return f"Feedback: {feedback}\nTurns left: {left} of {max_turns}."
