"""A config file may build on another (`extends:`): the one loader resolves the chain, an
overlay states only what differs, and a broken chain is refused naming the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlfleet.config import ConfigError, load_config, read_config_file
from rlfleet.learner_config import LearnerConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_overlay_changes_only_what_it_states(tmp_path: Path) -> None:
    write(tmp_path / "base.yaml", {"steps": 10, "data": {"size": 7, "group_size": 4},
                                   "optim": {"lr": 0.01}})
    write(tmp_path / "sub" / "big.yaml", {"extends": "../base.yaml", "data": {"size": 9}})
    cfg = load_config(LearnerConfig, tmp_path / "sub" / "big.yaml", env={})
    assert (cfg.steps, cfg.data.size, cfg.data.group_size, cfg.optim.lr) == (10, 9, 4, 0.01)


def test_a_chain_resolves_in_order(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", {"steps": 1, "seed": 1})
    write(tmp_path / "b.yaml", {"extends": "a.yaml", "steps": 2})
    write(tmp_path / "c.yaml", {"extends": "b.yaml", "seed": 3})
    assert read_config_file(tmp_path / "c.yaml") == {"steps": 2, "seed": 3}


def test_the_environment_and_flags_still_sit_above_the_chain(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", {"steps": 1, "seed": 1})
    write(tmp_path / "b.yaml", {"extends": "a.yaml", "steps": 2})
    cfg = load_config(LearnerConfig, tmp_path / "b.yaml", env={"RLFLEET_SEED": "7"},
                      overrides={"steps": 5})
    assert (cfg.steps, cfg.seed) == (5, 7)


def test_a_missing_base_is_refused_naming_both_files(tmp_path: Path) -> None:
    overlay = write(tmp_path / "o.yaml", {"extends": "nowhere.yaml", "steps": 1})
    with pytest.raises(ConfigError) as err:
        read_config_file(overlay)
    assert "o.yaml" in str(err.value) and "nowhere.yaml" in str(err.value)


@pytest.mark.parametrize("files", [
    {"self.yaml": {"extends": "self.yaml"}},
    {"a.yaml": {"extends": "b.yaml"}, "b.yaml": {"extends": "a.yaml"}},
])
def test_a_cycle_is_refused(tmp_path: Path, files: dict) -> None:
    for name, data in files.items():
        write(tmp_path / name, data)
    with pytest.raises(ConfigError, match="cycle"):
        read_config_file(tmp_path / next(iter(files)))


def test_a_key_the_base_does_not_have_is_refused_by_file_and_key(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", {"steps": 1, "data": {"size": 7}})
    overlay = write(tmp_path / "b.yaml", {"extends": "a.yaml", "data": {"sise": 9},
                                          "seed": 2})
    with pytest.raises(ConfigError) as err:
        read_config_file(overlay)
    message = str(err.value)
    assert "b.yaml" in message and "data.sise" in message and "seed" in message


def test_extends_must_name_a_file(tmp_path: Path) -> None:
    overlay = write(tmp_path / "b.yaml", {"extends": ["a.yaml"]})
    with pytest.raises(ConfigError, match="must name a file"):
        read_config_file(overlay)


def test_the_shipped_variants_are_short_overlays() -> None:
    variants = [p for p in sorted(CONFIGS.glob("*.yaml"))
                if "extends" in (yaml.safe_load(p.read_text()) or {})]
    assert {p.name for p in variants} >= {"local-tiny-9x9.yaml", "local-tiny-11x11.yaml"}
    for path in variants:
        raw = yaml.safe_load(path.read_text())
        assert (CONFIGS / raw["extends"]).is_file(), path.name
        assert len(raw) <= 6, f"{path.name} restates its base: {sorted(raw)}"
        load_config(LearnerConfig, path, env={})
