"""Which observation profiles a checkpoint may be served with, as the checkpoint says.

A policy only reads well what it was trained to read (prompt, feedback, frame size and
encoding, history: `rlfleet.policy.contexts`). A checkpoint records the profile it was
trained on and the profiles that are foreign to it, in its ``config.json``::

    "rlfleet_observation_profile": "frame_only",
    "rlfleet_foreign_profiles": ["visgym"]

or in its ``README.md`` (lines of a model card's YAML front matter)::

    observation_profile: frame_only
    foreign_observation_profiles: [visgym]

config.json wins where both say something. `check_observation_profile` refuses a foreign
profile with a message naming the trained one; a profile the checkpoint does not mark
foreign is served (a base model, or a policy that also reads a text task, is not refused
what nobody has measured it on).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from rlfleet.names import CONTEXTS

PROFILE_KEY = "rlfleet_observation_profile"
FOREIGN_KEY = "rlfleet_foreign_profiles"
_PROFILE_LINE = re.compile(r"^\s*observation_profile\s*:\s*([A-Za-z_]+)\s*(#.*)?$",
                           re.MULTILINE)
_FOREIGN_LINE = re.compile(r"^\s*foreign_observation_profiles\s*:\s*\[([^\]]*)\]\s*(#.*)?$",
                           re.MULTILINE)


class ForeignProfileError(ValueError):
    """A profile the checkpoint marks as foreign."""


@dataclass(frozen=True)
class ProfileMarks:
    """What a checkpoint says: the profile it was trained on (or None) and the profiles
    foreign to it, with the file that says so."""

    trained: str | None = None
    foreign: tuple[str, ...] = ()
    source: str = ""


def _check_names(names: list[str], where: str) -> None:
    unknown = [n for n in names if n not in CONTEXTS]
    if unknown:
        raise ValueError(f"{where} names unknown observation profiles {unknown}; known: "
                         f"{CONTEXTS}")


def profile_marks(model_dir: str | Path) -> ProfileMarks:
    """The marks of ``model_dir`` (config.json first, then README.md); unknown profile
    names are a ValueError naming the known ones."""
    model_dir = Path(model_dir)
    config = model_dir / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        if PROFILE_KEY in data or FOREIGN_KEY in data:
            trained = data.get(PROFILE_KEY)
            foreign = [str(n) for n in data.get(FOREIGN_KEY, [])]
            _check_names([*([str(trained)] if trained else []), *foreign], str(config))
            return ProfileMarks(str(trained) if trained else None, tuple(foreign),
                                str(config))
    readme = model_dir / "README.md"
    if readme.is_file():
        text = readme.read_text(errors="replace")
        trained_m, foreign_m = _PROFILE_LINE.search(text), _FOREIGN_LINE.search(text)
        if trained_m or foreign_m:
            trained = trained_m.group(1) if trained_m else None
            foreign = [n.strip().strip("'\"") for n in foreign_m.group(1).split(",")
                       if n.strip()] if foreign_m else []
            _check_names([*([trained] if trained else []), *foreign], str(readme))
            return ProfileMarks(trained, tuple(foreign), str(readme))
    return ProfileMarks()


def check_observation_profile(model_dir: str | Path, profile: str,
                              marks: ProfileMarks | None = None) -> None:
    """ForeignProfileError when ``model_dir`` marks ``profile`` as foreign."""
    marks = profile_marks(model_dir) if marks is None else marks
    if profile in marks.foreign:
        trained = (f"; it was trained on {marks.trained!r}: serve it with that context"
                   if marks.trained else "")
        raise ForeignProfileError(
            f"observation profile {profile!r} is foreign to the checkpoint {model_dir} "
            f"(marked in {marks.source}){trained}")


def mark_observation_profile(model_dir: str | Path, trained: str,
                             foreign: tuple[str, ...] = ()) -> None:
    """Record in ``model_dir``'s config.json the profile it was trained on and the
    profiles foreign to it."""
    _check_names([trained, *foreign], "mark_observation_profile")
    config = Path(model_dir) / "config.json"
    data = json.loads(config.read_text())
    data[PROFILE_KEY] = trained
    data[FOREIGN_KEY] = list(foreign)
    config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
