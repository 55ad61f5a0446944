"""A model of VisGym's maze_2d harness built from the recorded facts alone
(tests/data/visgym/maze_2d/harness.json and the pygame disc masks of
tests/unit/test_maze_visgym.py), sharing no code with rlfleet's visgym profile: it keeps
one canvas per episode and paints it the way VisGym's ``_render_frame`` does (white disc
on the cell the last move left, blue disc on the agent), and writes the harness's
messages from the recorded templates. The golden episodes under
tests/data/visgym/maze_2d/golden/ are its output; ``python -m tests.visgym_reference``
rewrites them.

Layouts come from `rlfleet.maze.generate_layout` (its equality with VisGym's generator is
tested on its own: tests/unit/test_maze_generate.py).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from rlfleet.maze import generate_layout
from tests.unit.test_maze_visgym import PYGAME_DISCS

DATA = Path(__file__).resolve().parent / "data" / "visgym" / "maze_2d"
HARNESS = json.loads((DATA / "harness.json").read_text())
GOLDEN = DATA / "golden"
_MOVES = {0: (0, 1), 1: (-1, 0), 2: (0, -1), 3: (1, 0)}  # VisGym's _action_to_direction


def instruction(height: int, width: int) -> str:
    i = HARNESS["instruction"]
    return (i["head"].format(height=height, width=width) + i["rgb_array"]
            + i["actions_header"] + i["actions_joiner"].join(i["actions"]) + i["success"]
            + i["examples_header"] + i["examples_joiner"].join(i["examples"])
            + i["verbalize_suffix"])


def step_message(taken: int, max_steps: int) -> str:
    return HARNESS["step"]["message"].format(step=taken + 1, left=max_steps - taken - 1)


def jpeg(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=HARNESS["image"]["format"],
                                 quality=HARNESS["image"]["quality"])
    return buf.getvalue()


@dataclass
class Canvas:
    """VisGym's per-episode pygame canvas, painted with the recorded disc mask."""

    walls: np.ndarray
    target: tuple[int, int]
    px: int = HARNESS["image"]["cell_px"]
    pixels: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        img = HARNESS["image"]
        h, w = self.walls.shape
        cells = np.where(self.walls[..., None], np.array(img["wall_rgb"], np.uint8),
                         np.array(img["floor_rgb"], np.uint8)).astype(np.uint8)
        cells[self.target] = img["target_rgb"]
        self.pixels = np.repeat(np.repeat(cells, self.px, 0), self.px, 1)
        self.disc = np.array([[c == "#" for c in line] for line in PYGAME_DISCS[self.px]])

    def _disc(self, cell: tuple[int, int], rgb: list[int]) -> None:
        r, c = cell
        block = self.pixels[r * self.px:(r + 1) * self.px, c * self.px:(c + 1) * self.px]
        block[self.disc] = rgb

    def render(self, agent: tuple[int, int], prev: tuple[int, int] | None) -> np.ndarray:
        if prev is not None:
            self._disc(prev, HARNESS["image"]["left_cell_disc_rgb"])
        self._disc(agent, HARNESS["image"]["agent_rgb"])
        return self.pixels.copy()


def _text4(x: object) -> bool:
    return (isinstance(x, str) and 1 <= len(x) <= 4
            and all(ch.isascii() and ch.isalnum() for ch in x))


@dataclass
class Env:
    """VisGym's maze_2d step, for the replies the golden episodes use (the harness passes
    the answer on as it is: each golden answer is either one literal or has no tuple)."""

    seed: int
    size: int = 9
    start: tuple[int, int] | None = None  # VisGym's init_state with another agent cell

    def __post_init__(self) -> None:
        layout = generate_layout(self.seed, self.size)
        self.walls = np.array(layout.walls, dtype=bool)
        self.agent, self.target = tuple(self.start or layout.agent), tuple(layout.target)
        self.prev: tuple[int, int] | None = None
        self.canvas = Canvas(self.walls, self.target)

    def render(self) -> np.ndarray:
        return self.canvas.render(self.agent, self.prev)

    def step(self, action: str) -> tuple[str, float, bool]:
        fb = HARNESS["feedback"]
        try:
            parsed = ast.literal_eval(action)
        except Exception as exc:  # noqa: BLE001 - as VisGym
            return fb["unparsable"].replace("{action!r}", repr(action)).replace(
                "{exc}", str(exc)), 0.0, False
        if not isinstance(parsed, tuple) or len(parsed) != 2:
            return fb["not_a_pair"], 0.0, False
        branch, payload = parsed
        if branch == "move":
            if not (isinstance(payload, int) and 0 <= payload < 4):
                return fb["not_in_space"].format(payload=payload, branch=branch), 0.0, False
            dr, dc = _MOVES[payload]
            nxt = (self.agent[0] + dr, self.agent[1] + dc)
            if self.walls[nxt]:
                return fb["wall"], 0.0, False
            self.prev, self.agent = self.agent, nxt
            return fb["ok"], 0.0, False
        if branch == "stop":
            if not _text4(payload):
                return fb["not_in_space"].format(payload=payload, branch=branch), 0.0, False
            return fb["ok"], 1.0 if self.agent == self.target else 0.0, True
        return fb["unknown_name"].format(branch=branch), 0.0, False


def answer_cut(reply: str) -> str:
    a = HARNESS["answer"]
    return reply.split(a["open"])[1].split(a["close"])[0] if a["open"] in reply else reply


def play(seed: int, max_steps: int, replies: list[str]) -> dict:
    """The harness's episode: messages (frames as "sha256:<jpeg sha256>" URLs), the frames'
    pixel and JPEG hashes, how it ended."""
    env = Env(seed)
    messages: list[dict] = []
    frames: list[dict] = []
    prefix = HARNESS["image"]["data_url_prefix"]
    taken, feedback, reward, terminated, truncated = 0, None, 0.0, False, False
    replies = iter(replies)
    while True:
        if taken >= max_steps:
            truncated = True
            break
        pixels = env.render()
        data = jpeg(pixels)
        frames.append({"rgb_sha256": hashlib.sha256(pixels.tobytes()).hexdigest(),
                       "jpeg_sha256": hashlib.sha256(data).hexdigest()})
        step = HARNESS["step"]
        if taken == 0:
            text = instruction(env.size, env.size) + step["first_joiner"] + \
                step_message(taken, max_steps)
        else:
            text = step["parts_joiner"].join(
                [step["feedback_prefix"] + feedback, step_message(taken, max_steps)])
        messages.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": prefix + "sha256:" +
                                                frames[-1]["jpeg_sha256"]}},
            {"type": "text", "text": text}]})
        reply = next(replies)
        messages.append({"role": "assistant", "content": reply})
        feedback, reward, terminated = env.step(answer_cut(reply))
        taken += 1
        if terminated:
            break
    return {"seed": seed, "size": env.size, "max_turns": max_steps, "frames": frames,
            "messages": messages,
            "end": {"turns": taken, "reward": reward, "terminated": terminated,
                    "truncated": truncated}}


def _r(action: str) -> str:
    return f"<think></think><answer>{action}</answer>"


# A reply as VisGym's trained-model eval elicits it (--elicit-verbalization): reasoning
# in <think> over several lines, far longer than the action, then the answer.
def _verbal(action: str, turn: int) -> str:
    thought = (f"Step {turn + 1}. I am the blue circle; the red square is the target in the "
               "opposite corner. Looking at the gray walls around me, the corridor I am in "
               "continues, so I should follow it rather than turn into a dead end.\n"
               "Checking each direction: a move into a wall would waste a step and the "
               "environment would report it. The open path leads towards the target, "
               "so I take it.") * 2
    return f"<think>{thought}</think>\n<answer>{action}</answer>"


def golden_episodes() -> dict[str, dict]:
    """The fixed episodes: a solve that leaves the target and comes back, a wall bump, an
    invalid reply of each kind, a timeout (at the published run's 15 steps); a timeout at
    VisGym's own limit (20 steps for 9x9), and a solve whose replies are long verbalized
    reasoning, carried in the history (at 20 steps)."""
    from rlfleet.maze.oracle import oracle_actions  # the path only; the words are ours

    def path(seed: int) -> list[str]:
        return [f"('move', {a.direction})" for a in oracle_actions(generate_layout(seed, 9))
                if not a.is_stop]

    solve = path(3)
    back = {"('move', 0)": "('move', 2)", "('move', 2)": "('move', 0)",
            "('move', 1)": "('move', 3)", "('move', 3)": "('move', 1)"}
    episodes = {
        "solve": (3, [*(_r(a) for a in solve), _r(back[solve[-1]]), _r(solve[-1]),
                      _r("('stop', 'stop')")]),
        "wall_bump": (5, [_r(a) for a in ("('move', 1)", "('move', 2)", "('move', 1)",
                                          "('stop', 'stop')")]),
        "invalid": (7, ["<think>left?</think><answer>go left</answer>",
                        _r("('jump', 1)"), _r("('move', 7)"), _r("('move',)"),
                        "('move', 0)", _r("('stop', 'stop!')"), _r("('stop', 'ok')")]),
        "timeout": (11, [_r(f"('move', {d})") for d in (3, 1, 0, 2) * 4][:15]),
    }
    easy = HARNESS["episode"]["max_steps"]["9"]
    moves = path(13)
    at_visgyms_limit = {
        "timeout_20": (11, [_r(f"('move', {d})") for d in (3, 1, 0, 2) * 5][:easy]),
        "verbalized": (13, [_verbal(a, i) for i, a in enumerate(
            [*moves[:2], back[moves[1]], moves[1], *moves[2:], "('stop', 'stop')"])]),
    }
    return {**{name: {**play(seed, 15, replies), "replies": replies}
               for name, (seed, replies) in episodes.items()},
            **{name: {**play(seed, easy, replies), "replies": replies}
               for name, (seed, replies) in at_visgyms_limit.items()}}


def write_golden() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, episode in golden_episodes().items():
        (GOLDEN / f"{name}.json").write_text(
            json.dumps(episode, indent=1, ensure_ascii=False) + "\n")


def data_url(png_or_jpeg: bytes) -> str:
    return HARNESS["image"]["data_url_prefix"] + base64.b64encode(png_or_jpeg).decode()


if __name__ == "__main__":
    write_golden()
