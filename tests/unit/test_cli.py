"""The `rlfleet` command as an operator and a readiness probe meet it: registering the
commands imports nothing heavy, `health` answers with one line and a meaningful exit code,
bad input gets one clear line (never a traceback), choices come from the library's own
definitions, and every flag says what it does and its default."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import typing
from collections.abc import Iterator

import pytest

from rlfleet.cli import build_parser
from rlfleet.cliargs import HelpFormatter
from rlfleet.local.procs import free_port, rlfleet_argv
from rlfleet.policy.contexts import CONTEXTS, PER_TURN_CONTEXTS
from rlfleet.policy.profiles import profile_names
from rlfleet.rpc.server import BindError, GrpcServer, ServerConfig

# What a readiness probe must not pay for (and what the commands import when they run).
HEAVY = ("torch", "transformers", "ray", "vllm", "grpc", "pydantic", "kubernetes", "numpy",
         "PIL", "peft")


def rlfleet(*args: str, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # auth on (the suite's default is off, which a started service warns about in a line)
    auth = {"RLFLEET_AUTH": "token", "RLFLEET_AUTH_TOKEN": "test-token"}
    return subprocess.run(rlfleet_argv(*args), capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **auth, **(env or {})})


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{text}"
    assert "Traceback" not in text
    return lines[0]


def imported_after(code: str) -> list[str]:
    """The heavy top-level packages a fresh interpreter holds after running `code`."""
    probe = (f"import json, sys\n{code}\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return sorted(set(json.loads(out.strip().splitlines()[-1])) & set(HEAVY))


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


# -- imports -----------------------------------------------------------------------------

def test_building_the_parser_imports_no_heavy_library() -> None:
    assert imported_after("from rlfleet.cli import build_parser; build_parser()") == []


def test_help_imports_no_heavy_library() -> None:
    code = ("from rlfleet.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n")
    assert imported_after(code) == []


def test_health_loads_no_other_command() -> None:
    code = (f"from rlfleet.cli import main\nmain(['health', '127.0.0.1:{free_port()}'])\n"
            "assert not any(m.startswith(('rlfleet_', 'rlfleet.sft', 'rlfleet.kube')) "
            "for m in sys.modules), sorted(sys.modules)")
    assert "torch" not in imported_after(code)


# -- health ------------------------------------------------------------------------------

def test_health_of_a_closed_port_fails_with_one_line() -> None:
    out = rlfleet("health", f"127.0.0.1:{free_port()}")
    assert out.returncode == 1
    assert out.stdout == ""
    assert "UNAVAILABLE" in one_line(out.stderr)


def test_health_of_a_serving_and_a_not_serving_server() -> None:
    with GrpcServer("probe-target", ServerConfig(port=0), []) as server:
        ok = rlfleet("health", server.address)
        assert ok.returncode == 0 and ok.stdout.strip() == "SERVING", ok.stderr
        server.set_serving(False)
        down = rlfleet("health", server.address)
        assert down.returncode == 1
        assert "NOT_SERVING" in one_line(down.stderr)
        unknown = rlfleet("health", server.address, "--service", "no.such.Service")
        assert unknown.returncode == 1
        assert "no.such.Service" in one_line(unknown.stderr)


@pytest.mark.parametrize("bad", ["foo", "host:notaport", "host:0", "host:70000", ":50051",
                                 "::1:50051"])
def test_health_refuses_a_bad_address_with_exit_2(bad: str) -> None:
    out = rlfleet("health", bad)
    assert out.returncode == 2
    assert repr(bad) in one_line(out.stderr)


def test_health_refuses_a_timeout_of_zero() -> None:
    out = rlfleet("health", "127.0.0.1:50051", "--timeout", "0")
    assert out.returncode == 2 and "--timeout" in one_line(out.stderr)


# -- serve: ports, hosts, model directories ----------------------------------------------

SERVE = {
    "env": ["env", "serve"],
    "rollout": ["rollout", "serve"],
    "ckptsync": ["ckptsync", "serve", "--redis-url", "redis://127.0.0.1:1/0"],
}


@pytest.mark.parametrize("service", sorted(SERVE))
@pytest.mark.parametrize("which", ["--port", "--metrics-port"])
def test_serve_on_a_taken_port_says_so_in_one_line(service: str, which: str,
                                                   taken_port: int) -> None:
    ports = {"--port": "0", "--metrics-port": "0", which: str(taken_port)}
    out = rlfleet(*SERVE[service], *[x for kv in ports.items() for x in kv])
    assert out.returncode == 1
    line = one_line(out.stderr)
    assert f"127.0.0.1:{taken_port}" in line and "already in use" in line


@pytest.mark.parametrize("service", sorted(SERVE))
def test_serve_on_an_unknown_host_says_so_in_one_line(service: str) -> None:
    out = rlfleet(*SERVE[service], "--host", "no-such-host.invalid", "--port", "0",
                  "--metrics-port", "0")
    assert out.returncode == 1
    assert "unknown host 'no-such-host.invalid'" in one_line(out.stderr)


def test_serve_with_an_out_of_range_port_says_so_in_one_line() -> None:
    out = rlfleet("env", "serve", "--port", "70000")
    assert out.returncode == 1
    assert "port" in one_line(out.stderr)


def test_rollout_with_a_missing_model_directory_says_so_in_one_line(tmp_path) -> None:  # noqa: ANN001
    out = rlfleet("rollout", "serve", "--model", str(tmp_path / "absent"))
    assert out.returncode == 2
    assert "no such directory" in one_line(out.stderr)


def test_rollout_with_a_missing_model_directory_from_the_env_says_so_in_one_line(
        tmp_path) -> None:  # noqa: ANN001
    out = rlfleet("rollout", "serve", "--port", "0", "--metrics-port", "0",
                  env={"RLFLEET_MODEL": str(tmp_path / "absent")})
    assert out.returncode == 1
    assert "does not exist" in one_line(out.stderr)


@pytest.mark.parametrize("address", ["foo", "host:notaport"])
@pytest.mark.parametrize("flag", ["--env-address", "--sync-address"])
def test_rollout_refuses_a_bad_address(flag: str, address: str) -> None:
    out = rlfleet("rollout", "serve", flag, address)
    assert out.returncode == 2 and flag in one_line(out.stderr)


def test_an_empty_optional_address_means_none() -> None:
    args = build_parser().parse_args(["rollout", "serve", "--sync-address", "",
                                      "--reward-address", ""])
    assert args.sync_address == "" and args.reward_address == ""


def test_a_server_on_a_taken_port_raises_bind_error(taken_port: int) -> None:
    with pytest.raises(BindError, match="already in use"):
        GrpcServer("taken", ServerConfig(port=taken_port), [])
    server = GrpcServer("metrics-taken", ServerConfig(port=0, metrics_port=taken_port), [])
    with pytest.raises(BindError, match=f"metrics on 127.0.0.1:{taken_port}"):
        server.start()


# -- choices and help --------------------------------------------------------------------

def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings)


def test_choices_are_the_library_definitions() -> None:
    from rlfleet_rollout.settings import RolloutSettings

    parser = build_parser()
    serve = _subparser(parser, "rollout", "serve")
    engines = typing.get_args(RolloutSettings.model_fields["engine"].annotation)
    assert list(_action(serve, "--engine").choices) == list(engines)
    assert list(_action(serve, "--profile").choices) == profile_names()
    assert list(_action(_subparser(parser, "rollout", "sample"), "--context").choices) == \
        list(CONTEXTS)
    assert list(_action(_subparser(parser, "sft"), "--context").choices) == \
        list(PER_TURN_CONTEXTS)


@pytest.mark.parametrize("argv", [
    ["rollout", "serve", "--engine", "tensorrt"],
    ["rollout", "serve", "--profile", "huge"],
    ["rollout", "sample", "--context", "everything"],
    ["sft", "--out", "/tmp/never", "--context", "full"],
    ["env", "serve", "--role", "judge"],
])
def test_a_value_outside_the_choices_is_refused(argv: list[str]) -> None:
    out = rlfleet(*argv)
    assert out.returncode == 2
    assert "invalid choice" in one_line(out.stderr)


def _all_parsers(parser: argparse.ArgumentParser,
                 path: str = "rlfleet") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_parsers(sub, f"{path} {name}")


def test_every_flag_has_help_that_shows_its_default() -> None:
    missing = []
    for path, parser in _all_parsers(build_parser()):
        formatter = HelpFormatter(path)
        for action in parser._actions:
            if not action.option_strings or isinstance(
                    action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            text = formatter._get_help_string(action) if action.help else ""
            if action.required:
                ok = bool(text)
            else:
                ok = "default" in text.lower()
            if not ok:
                missing.append(f"{path} {action.option_strings[0]}: {text!r}")
    assert missing == []


def test_settings_flags_show_the_settings_defaults() -> None:
    from rlfleet_env.settings import EnvSettings

    serve = _subparser(build_parser(), "env", "serve")
    text = serve.format_help()
    assert f"(default: {EnvSettings.model_fields['port'].default})" in text
    assert f"(default: {EnvSettings.model_fields['metrics_port'].default})" in text
    # an unset flag leaves the value of --config / RLFLEET_<KEY> in place
    args = build_parser().parse_args(["env", "serve"])
    assert args.port is None and args.max_episodes is None
