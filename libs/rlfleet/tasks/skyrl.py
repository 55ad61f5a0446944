"""Any registered `skyrl-gym` environment as an rlfleet env task, so SkyRL's environments
(text or multimodal) are played by rollout replicas and trained by the learner like the
maze. (The other direction, rlfleet's maze inside SkyRL, is `rlfleet.skyrl`.)

    rlfleet env serve --skyrl-env gsm8k_multi_turn=/shared/data/gsm8k.jsonl
    rlfleet env serve --skyrl-env my_package.envs:picture-count

serves task ``skyrl:<env id>``. A spec's ``seed`` picks the dataset row (``seed mod
rows``), so the learner's seed cursor walks the dataset; without a dataset every episode
starts from an empty prompt with ``extras = {"extra_info": {"seed": seed}}`` (for
environments that make their own task from a seed). ``max_turns``
caps the episode (default: the environment's own ``max_turns`` after ``init``, else
`DEFAULT_MAX_TURNS`); a capped episode ends truncated.

Mapping (SkyRL → rlfleet):
- the dataset row is SkyRL's: ``prompt`` (the chat given to ``init``), ``env_class``
  (ignored: the task names the env), and every other field (``reward_spec``,
  ``extra_info``, ...) passed as ``extras`` (``extra_info`` defaults to ``{}``);
- an observation (``init``'s conversation, or a step's ``observations``) becomes the
  observation text, the messages' text parts joined by blank lines, and its picture, the
  first ``image_url`` data URL among them (re-encoded as PNG when it is not one); later
  pictures of the same observation are not carried (the contract has one per
  observation);
- a step's ``reward`` is the step reward; the episode ends when the env says ``done``;
  a solve is an episode the env ended itself with a positive last reward;
- ``postprocessed_action``, if the env gives one, is the step's canonical action.

An environment is named ``[module:]ENV_ID``: the module is imported first, for
environments that register themselves with `skyrl_gym.register` when imported.
"""

from __future__ import annotations

import importlib
import io
import json
from pathlib import Path
from typing import Any

from rlfleet.data_urls import data_url_bytes
from rlfleet.registries import RegistryError
from rlfleet.tasks import (
    Image,
    SimpleEpisode,
    StepResult,
    Task,
    TaskInfo,
    image_from_png,
)

PREFIX = "skyrl:"
DEFAULT_MAX_TURNS = 20


def _text_and_image(messages: Any) -> tuple[str, Image | None]:
    """The text parts of OpenAI-style messages joined by blank lines, and the first
    picture among them."""
    texts: list[str] = []
    image: Image | None = None
    for message in messages or []:
        content = message.get("content") if isinstance(message, dict) else message
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            if isinstance(part, str):
                if part:
                    texts.append(part)
            elif isinstance(part, dict):
                if part.get("type") == "text" or "text" in part:
                    text = part.get("text") or ""
                    if text:
                        texts.append(str(text))
                elif image is None and (part.get("type") == "image_url" or "image_url" in part):
                    image = _decode_image(part.get("image_url"))
    return "\n\n".join(texts), image


def _decode_image(url: Any) -> Image:
    raw = data_url_bytes(url, "a SkyRL observation image")
    try:
        return image_from_png(raw)
    except ValueError:
        from PIL import Image as PILImage

        with PILImage.open(io.BytesIO(raw)) as img:
            buf = io.BytesIO()
            img.convert("RGB").save(buf, format="PNG")
        return image_from_png(buf.getvalue())


class SkyRLEpisode(SimpleEpisode):
    """One `skyrl_gym` environment object, from ``init`` to ``done``."""

    def __init__(self, env: Any, conversation: Any, max_turns: int) -> None:
        text, image = _text_and_image(conversation)
        super().__init__(instruction=text, max_turns=max_turns)
        self.env = env
        self._image = image
        self._status = ""
        self._last_reward = 0.0

    def act(self, text: str) -> StepResult:
        out = self.env.step(text)
        reward = float(out.get("reward") or 0.0)
        done = bool(out.get("done"))
        obs_text, obs_image = _text_and_image(out.get("observations"))
        self._status = obs_text
        self._image = obs_image  # this observation's picture; None for a text-only one
        action = out.get("postprocessed_action") or ""
        self._last_reward = reward
        return StepResult(reward=reward, parsed=True, action=str(action)[:256], done=done,
                          solved=done and reward > 0, feedback=obs_text)

    def status(self) -> str:
        return self._status

    def image(self) -> Image | None:
        return self._image

    def close(self) -> None:
        try:
            self.env.close()
        except Exception:  # noqa: BLE001, S110 - third-party cleanup must not fail a call
            pass


class SkyRLTask(Task):
    """A registered skyrl-gym environment, with an optional dataset of SkyRL rows."""

    def __init__(self, env_id: str, *, dataset: list[dict] | None = None,
                 env_config: dict | None = None, name: str | None = None,
                 description: str = "", max_turns: int = 0) -> None:
        import skyrl_gym

        if env_id not in skyrl_gym.registry:
            raise RegistryError(f"no skyrl-gym environment {env_id!r} is registered; "
                              f"registered: {sorted(skyrl_gym.registry)}")
        self.env_id = env_id
        self.dataset = list(dataset or [])
        self.env_config = dict(env_config or {})
        self.max_turns = max_turns
        rows = f", {len(self.dataset)} dataset rows" if self.dataset else ""
        self.info = TaskInfo(name=name or PREFIX + env_id,
                             description=description or f"skyrl-gym environment {env_id}{rows}",
                             default_max_turns=max_turns)

    def open(self, spec: Any) -> SkyRLEpisode:
        import skyrl_gym

        # Ignored, as settings a generic client sends for every task: render options (the
        # env draws its own pictures; replicas ask every task for their profile's cell
        # size), and the learner's size and turn_margin (its data config always has them).
        # A layout or an action format would change what is played: refused.
        if spec.HasField("layout") or spec.format:
            raise ValueError("a SkyRL task takes seed and max_turns only (no layout or "
                             "format; size, turn_margin and render are ignored)")
        # Without a dataset the env makes its own task; the seed is its only input.
        row = dict(self.dataset[spec.seed % len(self.dataset)]) if self.dataset else \
            {"extra_info": {"seed": spec.seed}}
        prompt = row.pop("prompt", None) or []
        row.pop("env_class", None)
        row.setdefault("extra_info", {})
        if spec.max_turns:
            row.setdefault("max_turns", spec.max_turns)
        try:
            env = skyrl_gym.make(self.env_id, env_config=dict(self.env_config), extras=row)
            conversation, _info = env.init(prompt)
        except Exception as exc:  # noqa: BLE001 - the env refused this spec (its dataset row)
            raise ValueError(f"skyrl-gym environment {self.env_id!r} cannot start an episode "
                             f"of seed {spec.seed}: {type(exc).__name__}: {exc}") from exc
        limit = spec.max_turns or self.max_turns or int(getattr(env, "max_turns", 0) or 0) \
            or DEFAULT_MAX_TURNS
        return SkyRLEpisode(env, conversation, limit)


def load_dataset(path: str | Path) -> list[dict]:
    """SkyRL dataset rows from a JSON-lines file (one object per line) or a JSON list."""
    text = Path(path).read_text()
    stripped = text.lstrip()
    if stripped.startswith("["):
        rows = json.loads(stripped)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise RegistryError(f"{path}: a SkyRL dataset is a non-empty list of JSON objects")
    return rows


def skyrl_task(spec: str) -> SkyRLTask:
    """The task for ``[module:]ENV_ID[=DATASET]`` (the ``--skyrl-env`` flag)."""
    name, _, data = spec.partition("=")
    module, _, env_id = name.rpartition(":")
    if not env_id:
        raise RegistryError(f"--skyrl-env {spec!r}: give [module:]ENV_ID[=DATASET]")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise RegistryError(f"--skyrl-env {spec!r}: cannot import {module}: {exc}") from exc
    try:
        dataset = load_dataset(data) if data else None
    except (OSError, ValueError) as exc:
        raise RegistryError(f"--skyrl-env {spec!r}: cannot read the dataset: {exc}") from exc
    return SkyRLTask(env_id, dataset=dataset)
