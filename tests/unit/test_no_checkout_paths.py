"""The library does not know the checkout: its defaults into configs/, runs/ and deploy/ are
relative to the current directory (`make run` and the chart checks run from the repository
root), and every one of them can be given explicitly, so an installed rlfleet works from
anywhere."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from rlfleet.kube import manifests
from rlfleet.local import run as local_run

ROOT = Path(__file__).resolve().parents[2]  # the tests know the checkout; the library not
CRDS = ROOT / "deploy" / "schemas" / "crds"
RAYJOB = {
    "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "j"},
    "spec": {"entrypoint": "python -m x", "no_such_field": 1},
}


def test_no_library_module_walks_up_from_its_own_file() -> None:
    sources = [*(ROOT / "libs").rglob("*.py"), *(ROOT / "services").rglob("*.py")]
    offenders = [str(p.relative_to(ROOT)) for p in sources
                 if re.search(r"__file__\)?(\.resolve\(\))?\.parents\[", p.read_text())]
    assert offenders == []


def test_crd_schemas_load_from_the_repository_root(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(ROOT)
    assert ("ray.io/v1", "RayJob") in manifests.load_crd_schemas()


def test_crd_schemas_given_explicitly_load_from_any_directory(tmp_path: Path,
                                                              monkeypatch) -> None:  # noqa: ANN001
    copy = tmp_path / "crds"
    shutil.copytree(CRDS, copy)
    monkeypatch.chdir(tmp_path / "crds")
    problems = manifests.Validator(crd_dir=copy).validate(RAYJOB)
    assert any("no_such_field" in p.message for p in problems)  # the RayJob schema is used


def test_missing_crd_schemas_are_one_clear_line(tmp_path: Path, monkeypatch, capsys) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape(f"(under {tmp_path})")):
        manifests.load_crd_schemas()
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(RAYJOB))
    with pytest.raises(SystemExit) as exit_:
        manifests.main(["m.yaml"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--crds DIR" in err
    assert manifests.main(["m.yaml", "--crds", str(CRDS)]) == 1  # explicit: it validates
    assert "no_such_field" in capsys.readouterr().out


def test_local_run_config_from_the_repository_root(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(ROOT)
    cfg = local_run.learner_config(local_run.DEFAULT_CONFIG, run="r1", steps=3)
    assert (cfg.run, cfg.steps) == ("r1", 3)
    assert cfg.model.path == ROOT / "warm-starts" / "tiny-sft-feedback"


def test_local_run_config_given_explicitly_from_another_directory(tmp_path: Path,
                                                                  monkeypatch) -> None:  # noqa: ANN001
    config = tmp_path / "exp" / "learner.yaml"
    config.parent.mkdir()
    config.write_text(yaml.safe_dump({"steps": 5, "model": {"path": "models/sft"}}))
    monkeypatch.chdir(tmp_path)
    cfg = local_run.learner_config(config, run="r2", steps=None)
    assert (cfg.run, cfg.steps) == ("r2", 5)
    assert cfg.model.path == tmp_path / "models" / "sft"  # relative to the cwd


def test_local_run_without_its_config_is_a_clear_usage_error(tmp_path: Path, monkeypatch,
                                                             capsys) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        local_run.main(["--steps", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no config file configs/local-tiny.yaml" in err and "--config FILE" in err
    assert not (tmp_path / "runs").exists()  # nothing was started or written


@pytest.mark.parametrize(("module", "argv", "message"), [
    ("run", ["--replicas", "two"], "argument --replicas: invalid int value: 'two'"),
    ("policy_bounds", ["--env-address", "nope"],
     "argument --env-address: not HOST:PORT: 'nope'"),
])
def test_make_run_and_policy_bounds_parse_with_the_clis_parser(
        module: str, argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    from rlfleet.local import policy_bounds

    main = {"run": local_run.main, "policy_bounds": policy_bounds.main}[module]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    # rlfleet.cliargs.Parser: one line, naming the command and its --help
    assert err.count("\n") == 1 and message in err
    assert f"(see: python -m rlfleet.local.{module} --help)" in err
