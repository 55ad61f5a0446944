"""Every service's settings and the learner's config come out the same whether a value
is given in the config file, in the environment (RLFLEET_<KEY>, nested RLFLEET_<A>__<B>)
or as a flag of the real `rlfleet` command (a named flag or `--set KEY=VALUE`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlfleet.cli import build_parser
from rlfleet.config import ConfigError, load_config
from rlfleet.service import load_settings

# (settings model, the command, the values in a file, the same in the environment, the
# same as flags)
SERVICES = {
    "rollout": (
        "rlfleet_rollout.settings:RolloutSettings", ["rollout", "serve"],
        {"port": 50999, "max_batch": 7, "run": "r1", "heartbeat_s": 1.5,
         "engine_args": {"dtype": "float32"}, "env_address": "10.0.0.1:50051"},
        {"RLFLEET_PORT": "50999", "RLFLEET_MAX_BATCH": "7", "RLFLEET_RUN": "r1",
         "RLFLEET_HEARTBEAT_S": "1.5", "RLFLEET_ENGINE_ARGS": '{"dtype": "float32"}',
         "RLFLEET_ENV_ADDRESS": "10.0.0.1:50051"},
        ["--port", "50999", "--max-batch", "7", "--run", "r1", "--set", "heartbeat_s=1.5",
         "--engine-args", '{"dtype": "float32"}', "--env-address", "10.0.0.1:50051"]),
    "env": (
        "rlfleet_env.settings:EnvSettings", ["env", "serve"],
        {"tasks": ["maze_2d"], "max_episodes": 5, "episode_ttl_s": 9.5, "role": "env"},
        {"RLFLEET_TASKS": "maze_2d", "RLFLEET_MAX_EPISODES": "5",
         "RLFLEET_EPISODE_TTL_S": "9.5", "RLFLEET_ROLE": "env"},
        ["--tasks", "maze_2d", "--set", "max_episodes=5", "--set", "episode_ttl_s=9.5",
         "--role", "env"]),
    "ckptsync": (
        "rlfleet_ckptsync.settings:SyncSettings", ["ckptsync", "serve"],
        {"keep_last": 5, "gc_delay_s": 1.5, "redis_url": "redis://r:6379/1",
         "runs_root": "/tmp/somewhere"},
        {"RLFLEET_KEEP_LAST": "5", "RLFLEET_GC_DELAY_S": "1.5",
         "RLFLEET_REDIS_URL": "redis://r:6379/1", "RLFLEET_RUNS_ROOT": "/tmp/somewhere"},
        ["--keep-last", "5", "--gc-delay-s", "1.5", "--redis-url", "redis://r:6379/1",
         "--set", "runs_root=/tmp/somewhere"]),
}

LEARNER = (
    {"steps": 3, "grpo": {"kl_coef": 0.01, "micro_batch_size": 2},
     "optim": {"betas": [0.8, 0.9], "lr": 1e-4}, "data": {"context": "full"},
     "fleet": {"redis_url": "redis://r:6379/2"}, "model": {"lora_rank": 8},
     "metrics": {"host": "0.0.0.0", "port": 9999}, "tls": {"ca": "/etc/tls/ca.pem"}},
    {"RLFLEET_STEPS": "3", "RLFLEET_GRPO__KL_COEF": "0.01",
     "RLFLEET_GRPO__MICRO_BATCH_SIZE": "2", "RLFLEET_OPTIM__BETAS": "[0.8, 0.9]",
     "RLFLEET_OPTIM__LR": "1e-4", "RLFLEET_DATA__CONTEXT": "full",
     "RLFLEET_FLEET__REDIS_URL": "redis://r:6379/2", "RLFLEET_MODEL__LORA_RANK": "8",
     "RLFLEET_HOST": "0.0.0.0", "RLFLEET_METRICS_PORT": "9999",
     "RLFLEET_TLS__CA": "/etc/tls/ca.pem"},
    ["--steps", "3", "--set", "grpo.kl_coef=0.01", "--set", "grpo.micro_batch_size=2",
     "--set", "optim.betas=[0.8, 0.9]", "--set", "optim.lr=1e-4",
     "--set", "data.context=full", "--set", "fleet.redis_url=redis://r:6379/2",
     "--set", "model.lora_rank=8", "--metrics-host", "0.0.0.0", "--metrics-port", "9999",
     "--set", "tls.ca=/etc/tls/ca.pem"],
)

# The learner config from a file, the environment and flags with the library alone (a
# process of its own: nothing else has imported the learner service into it).
LIBRARY_ONLY = """
import json, sys
from rlfleet.cliargs import Parser, add_learner_args
from rlfleet.learner_config import flag_overrides, load_learner_config
file, empty, env, flags = json.loads(sys.argv[1])
parser = Parser()
add_learner_args(parser)
configs = [load_learner_config(file, {}), load_learner_config(empty, env),
           load_learner_config(empty, {}, **flag_overrides(parser.parse_args(
               ["--config", empty, *flags])))]
print(json.dumps({"learner service imported": "rlfleet_learner" in sys.modules
                  or any(m.startswith("rlfleet_learner.") for m in sys.modules),
                  "configs": [c.model_dump(mode="json") for c in configs]}))
"""


@pytest.fixture(autouse=True)
def no_rlfleet_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("RLFLEET_"):
            monkeypatch.delenv(key)


def model_of(ref: str) -> Any:
    from rlfleet.cliargs import attribute

    return attribute(ref)


def write(path: Path, values: dict) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_service_setting_is_the_same_from_file_env_and_flags(
        service: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref, command, file_values, env_values, flags = SERVICES[service]
    model = model_of(ref)
    from_file = load_config(model, write(tmp_path / "s.yaml", file_values), env={})
    from_env = load_config(model, None, env=env_values)
    args = build_parser().parse_args([*command, *flags])
    from_flags = load_settings(model, args)
    assert from_file.model_dump() == from_env.model_dump() == from_flags.model_dump()
    assert from_file.model_dump() != model().model_dump()  # the values were all used
    for key, value in file_values.items():
        got = getattr(from_file, key)
        assert (str(got) if isinstance(got, Path) else got) == value


def test_the_learner_config_is_the_same_from_file_env_and_flags(tmp_path: Path) -> None:
    from rlfleet.learner_config import LearnerConfig

    file_values, env_values, flags = LEARNER
    paths = [str(write(tmp_path / "l.yaml", file_values)), str(write(tmp_path / "e.yaml", {}))]
    out = subprocess.run([sys.executable, "-c", LIBRARY_ONLY,
                          json.dumps([*paths, env_values, flags])],
                         capture_output=True, text=True, check=True, timeout=120)
    got = json.loads(out.stdout)
    assert got["learner service imported"] is False
    from_file, from_env, from_flags = got["configs"]
    assert from_file == from_env == from_flags
    cfg = LearnerConfig.model_validate(from_file)
    assert cfg != LearnerConfig()
    assert (cfg.grpo.kl_coef, cfg.optim.betas, cfg.data.context, cfg.model.lora_rank,
            cfg.metrics.host, cfg.metrics.port, str(cfg.tls.ca)) == (
        0.01, (0.8, 0.9), "full", 8, "0.0.0.0", 9999, "/etc/tls/ca.pem")


def test_the_learner_command_reads_its_flags_as_the_library_does(tmp_path: Path) -> None:
    from rlfleet.learner_config import flag_overrides, load_learner_config

    empty = write(tmp_path / "empty.yaml", {})
    args = build_parser().parse_args(["learner", "run", "--config", str(empty), *LEARNER[2]])
    assert (load_learner_config(empty, {}, **flag_overrides(args))
            == load_learner_config(write(tmp_path / "l.yaml", LEARNER[0]), {}))


def test_the_metrics_endpoint_is_file_then_environment_then_flags(tmp_path: Path) -> None:
    from rlfleet.cliargs import Parser, add_learner_args
    from rlfleet.learner_config import flag_overrides, load_learner_config

    path = write(tmp_path / "l.yaml", {"metrics": {"host": "10.0.0.1", "port": 9000}})
    parser = Parser()
    add_learner_args(parser)

    def cfg(env: dict, *flags: str) -> tuple:
        args = parser.parse_args(["--config", str(path), *flags])
        got = load_learner_config(path, env, **flag_overrides(args)).metrics
        return got.host, got.port

    assert cfg({}) == ("10.0.0.1", 9000)
    # the chart's RLFLEET_HOST / RLFLEET_METRICS_PORT replace the file's ...
    pod = {"RLFLEET_HOST": "0.0.0.0", "RLFLEET_METRICS_PORT": "9104"}
    assert cfg(pod) == ("0.0.0.0", 9104)
    # ... the canonical nested names replace those ...
    assert cfg({**pod, "RLFLEET_METRICS__HOST": "::"}) == ("::", 9104)
    # ... and a flag replaces them all (RLFLEET_HOST used to override --metrics-host)
    assert cfg(pod, "--metrics-host", "127.0.0.2") == ("127.0.0.2", 9104)
    assert cfg(pod, "--metrics-port", "9200") == ("0.0.0.0", 9200)


def test_the_learner_tls_is_the_services_files(tmp_path: Path) -> None:
    from rlfleet.learner_config import load_learner_config
    from rlfleet.service import ServiceSettings

    empty = write(tmp_path / "empty.yaml", {})
    env = {"RLFLEET_TLS_CLIENT_CA": "/tls/ca.pem", "RLFLEET_TLS_CERT": "/tls/c.pem",
           "RLFLEET_TLS_KEY": "/tls/k.pem"}
    learner = load_learner_config(empty, env).tls.options()
    service = load_config(ServiceSettings, None, env=env).client_tls()
    assert learner == service == {"ca_file": Path("/tls/ca.pem"),
                                  "cert_file": Path("/tls/c.pem"),
                                  "key_file": Path("/tls/k.pem")}
    assert load_learner_config(empty, {}).tls.options() is None  # plaintext


def test_precedence_is_file_then_environment_then_flags(tmp_path: Path) -> None:
    from rlfleet.learner_config import load_learner_config

    path = write(tmp_path / "l.yaml", {"grpo": {"kl_coef": 0.1, "clip_low": 0.3}})
    cfg = load_learner_config(path, {"RLFLEET_GRPO__KL_COEF": "0.2", "RLFLEET_GRPO__EPS": "1e-5"},
                         grpo={"kl_coef": 0.3})
    # each level replaces only the fields it names: a section is merged, not replaced
    assert (cfg.grpo.kl_coef, cfg.grpo.clip_low, cfg.grpo.eps) == (0.3, 0.3, 1e-5)


def test_deployment_aliases_sit_below_the_canonical_names(tmp_path: Path) -> None:
    from rlfleet.learner_config import load_learner_config

    empty = write(tmp_path / "empty.yaml", {})
    cfg = load_learner_config(empty, {"RLFLEET_REDIS_URL": "redis://alias:1/0",
                                 "RLFLEET_MODEL": "/models/sft"})
    assert (cfg.fleet.redis_url, str(cfg.model.path)) == ("redis://alias:1/0", "/models/sft")
    cfg = load_learner_config(empty, {"RLFLEET_REDIS_URL": "redis://alias:1/0",
                                 "RLFLEET_FLEET__REDIS_URL": "redis://canonical:1/0"})
    assert cfg.fleet.redis_url == "redis://canonical:1/0"


@pytest.mark.parametrize(("env", "message"), [
    ({"RLFLEET_GRPO__KL_COEF": "-1"}, "GRPOConfig.kl_coef=-1.0 must be >= 0"),
    ({"RLFLEET_GRPO__NO_SUCH": "1"}, "grpo.no_such: Extra inputs are not permitted"),
    ({"RLFLEET_OPTIM__BETAS": "not json"}, "takes JSON"),
    ({"RLFLEET_GRPO": "0.5"}, "grpo: Input should be a valid dictionary"),
    ({"RLFLEET_GRPO": "kl_coef"}, "takes JSON"),
])
def test_a_bad_environment_value_is_one_clear_error(env: dict, message: str,
                                                     tmp_path: Path) -> None:
    from rlfleet.learner_config import load_learner_config

    with pytest.raises(ConfigError, match=message):
        load_learner_config(write(tmp_path / "empty.yaml", {}), env)


def test_a_set_flag_that_is_not_key_value_is_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["ckptsync", "serve", "--set", "keep_last"])
    assert exit_.value.code == 2
    assert "not KEY=VALUE" in capsys.readouterr().err


def test_an_unknown_set_key_names_itself(tmp_path: Path) -> None:
    model = model_of(SERVICES["ckptsync"][0])
    args = build_parser().parse_args(["ckptsync", "serve", "--set", "keep_lats=2"])
    with pytest.raises(ConfigError, match="keep_lats: Extra inputs are not permitted"):
        load_settings(model, args)
