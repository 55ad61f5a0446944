"""`rlfleet learner submit|logs|status|stop`: the learner as a job on a remote Ray cluster,
through the Ray Jobs API (the dashboard's job server, port 8265; the HyperPod Ray endpoint
operator exposes it), as the reference does from a SageMaker Studio notebook.

What travels with the job, and how:
- the learner config: its content, as the one file of the job's runtime_env working_dir;
  the entrypoint is `rlfleet learner run --config learner.yaml` (the cluster's own
  rlfleet validates it: the cluster's version defines the schema).
- the fleet's token: read here from a file or a Kubernetes Secret, never from the command
  line, and put in the same working_dir, with RLFLEET_AUTH_TOKEN_FILE naming it. Not in
  runtime_env env_vars: the job server returns those in plain text to every `ray job list`
  and `ray job status`.
- Ray's own token (Ray 2.60 turns token auth on by default): an Authorization header, read
  from --ray-token-file, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token.
- the console (--console human|json): RLFLEET_CONSOLE in the job's env_vars, so the
  followed log is short lines for a person (the JSON lines then go to the run's
  logs/learner.log) or JSON lines for log tooling; unset, the cluster's own setting.

The job's log as printed here (--wait, `logs`) leaves out Ray's own INFO lines ("Runtime
env is setting up", the SDK's "Uploading package"): library chatter, not the learner.

Ray is imported inside the command functions only: `rlfleet --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from rlfleet.logs import CONSOLE_ENV, CONSOLE_MODES
from rlfleet_learner.ray_logs import is_library_chatter

# Names inside the job's working directory (the entrypoint's current directory).
CONFIG_NAME = "learner.yaml"
TOKEN_NAME = "fleet_token"
DEFAULT_SECRET_KEY = "token"  # the chart's auth Secret (<release>-auth) keeps it here
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class SubmitError(Exception):
    """A request that cannot be carried out; the one-line message says why."""


# -- what the job carries -----------------------------------------------------------------

def read_config(path: str) -> str:
    """The learner config's text, checked only for being a readable YAML mapping."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SubmitError(f"cannot read learner config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SubmitError(f"learner config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SubmitError(f"learner config {path} must hold a mapping")
    return text


def _token_file(path: str, what: str) -> str:
    from rlfleet.config import ConfigError, read_token_file

    try:
        return read_token_file(path, what)
    except ConfigError as exc:
        raise SubmitError(str(exc)) from None


def token_from_file(path: str) -> str:
    return _token_file(path, "token file")


def parse_secret_ref(ref: str) -> tuple[str, str, str]:
    """NAMESPACE/NAME[:KEY] -> (namespace, name, key)."""
    ref, _, key = ref.partition(":")
    namespace, _, name = ref.partition("/")
    if not namespace or not name or "/" in name:
        raise SubmitError(f"--token-secret must be NAMESPACE/NAME[:KEY], got {ref!r}")
    return namespace, name, key or DEFAULT_SECRET_KEY


def token_from_secret(ref: str) -> str:
    """The token in a Kubernetes Secret, through the current kube context."""
    import base64

    try:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
    except ImportError:
        raise SubmitError("--token-secret needs the kubernetes package (pip install "
                          "'rlfleet[kube]'); or give --token-file") from None
    from urllib3.exceptions import HTTPError

    from rlfleet.kube.scale import ScaleError, connect

    namespace, name, key = parse_secret_ref(ref)
    try:
        api, _ = connect()
    except ScaleError as exc:
        raise SubmitError(str(exc)) from None
    try:
        secret = client.CoreV1Api(api).read_namespaced_secret(name, namespace,
                                                              _request_timeout=15)
    except ApiException as exc:
        if exc.status == 404:
            raise SubmitError(f"no Secret {name} in namespace {namespace}") from None
        raise SubmitError(f"cannot read Secret {namespace}/{name}: {exc.status} "
                          f"{exc.reason}") from None
    except (HTTPError, OSError) as exc:
        raise SubmitError(f"cannot reach the Kubernetes API server at "
                          f"{api.configuration.host}: {exc}") from None
    data = secret.data or {}
    if key not in data:
        raise SubmitError(f"Secret {namespace}/{name} has no key {key!r} "
                          f"(it has: {', '.join(sorted(data)) or 'none'})")
    token = base64.b64decode(data[key]).decode().strip()
    if not token:
        raise SubmitError(f"the fleet token in Secret {namespace}/{name} is empty")
    return token


def fleet_token(args: argparse.Namespace) -> str | None:
    """The fleet token to send, or None where auth is turned off explicitly."""
    if args.token_file:
        return token_from_file(args.token_file)
    if args.token_secret:
        return token_from_secret(args.token_secret)
    if args.insecure_no_auth:
        return None
    raise SubmitError("no fleet token: give --token-file PATH or --token-secret "
                      "NAMESPACE/NAME[:KEY] (the chart's is <release>-auth), or "
                      "--insecure-no-auth for a fleet without auth")


def entrypoint(run: str | None, resume: str) -> str:
    """The real learner command, run in the job's working directory."""
    argv = ["rlfleet", "learner", "run", "--config", CONFIG_NAME, "--resume", resume]
    if run:
        argv += ["--run", run]
    return shlex.join(argv)


def write_working_dir(directory: Path, config_text: str, token: str | None,
                      stop_grace_s: int, console: str | None = None) -> dict[str, Any]:
    """Fills `directory` with what the job needs; returns the job's runtime_env."""
    (directory / CONFIG_NAME).write_text(config_text)
    # Ray's job supervisor reads it from the job's env_vars: how long a stop waits after
    # SIGTERM (the learner finishes or abandons its step and checkpoints) before SIGKILL;
    # Ray's own default, 3 s, would lose the steps since the last checkpoint.
    env_vars = {"RAY_JOB_STOP_WAIT_TIME_S": str(stop_grace_s)}
    if console:
        env_vars[CONSOLE_ENV] = console
    if token is None:
        env_vars["RLFLEET_AUTH"] = "none"
    else:
        path = directory / TOKEN_NAME
        path.touch(mode=0o600)
        path.write_text(token)
        # relative: the job's current directory is its unpacked working_dir
        env_vars["RLFLEET_AUTH_TOKEN_FILE"] = TOKEN_NAME
    return {"working_dir": str(directory), "env_vars": env_vars}


# -- the Ray Jobs client ------------------------------------------------------------------

def ray_token(path: str | None, address: str) -> str | None:
    """Ray's auth token: --ray-token-file, else what Ray itself reads (RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token) for a plain http(s) address. Other schemes
    (e.g. sagemaker_ray://) authenticate through the module that registers them."""
    if path:
        return _token_file(path, "Ray token file")
    if "://" in address and not address.startswith(("http://", "https://")):
        return None
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip()
    default = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    try:
        return Path(default).read_text().strip() or None
    except OSError:
        return None


def quiet_ray_sdk() -> None:
    """The SDK's own INFO lines ("Uploading package ...", "WebSocket closed ...") are not
    the job's: only its warnings reach this command's stderr. Its modules set INFO on
    their own loggers, so each Ray logger that exists once it is imported is raised."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if (name == "ray" or name.startswith("ray.")) and isinstance(logger, logging.Logger):
            logger.setLevel(max(logger.level, logging.WARNING))


def connect(args: argparse.Namespace) -> Any:
    """A JobSubmissionClient for --address (its constructor checks the address answers);
    an address that does not answer is tried again for --connect-timeout seconds (a Ray
    head that is still starting, e.g. the chart's submitter started beside it)."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    if getattr(args, "ray_token_secret", None):
        token: str | None = token_from_secret(args.ray_token_secret)
    else:
        token = ray_token(args.ray_token_file, args.address)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    quiet_ray_sdk()
    deadline = time.monotonic() + max(0.0, getattr(args, "connect_timeout", 0.0) or 0.0)
    while True:
        try:
            return JobSubmissionClient(args.address, headers=headers)
        except ConnectionError:
            if time.monotonic() < deadline:
                time.sleep(2.0)
                continue
            raise SubmitError(f"cannot reach the Ray Jobs API at {args.address} (is the "
                              "address right, the Ray head up, and the port-forward or "
                              "endpoint running?)") from None
        except AuthenticationError:
            raise SubmitError(f"the Ray Jobs API at {args.address} refused Ray's token: "
                              "give the cluster's with --ray-token-file, --ray-token-secret "
                              "or RAY_AUTH_TOKEN_PATH") from None
        except (RuntimeError, ValueError) as exc:
            raise SubmitError(f"cannot use the Ray Jobs API at {args.address}: "
                              f"{_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _job_call(args: argparse.Namespace, fn: Any, job_id: str) -> Any:
    """fn(job_id), with Ray's 404 turned into 'no such job'."""
    try:
        return fn(job_id)
    except RuntimeError as exc:
        if "404" in str(exc) or "does not exist" in str(exc):
            raise SubmitError(f"no job {job_id} on the Ray cluster at {args.address}") from None
        raise SubmitError(f"Ray Jobs API at {args.address}: {_first_line(exc)}") from None


def wait_terminal(client: Any, args: argparse.Namespace, job_id: str,
                  timeout_s: float) -> str:
    """The job's status once terminal; SubmitError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = str(_job_call(args, client.get_job_status, job_id).value)
        if status in TERMINAL:
            return status
        if time.monotonic() >= deadline:
            raise SubmitError(f"job {job_id} is still {status} after {timeout_s:g} s")
        time.sleep(1.0)


class JobLogPrinter:
    """Writes a job's log, arriving in chunks that may split lines, without Ray's own
    lines below WARNING (its job manager's, in Ray's log format)."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self._partial = ""

    def write(self, chunk: str) -> None:
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()
        kept = [line for line in lines if not is_library_chatter(line)]
        if kept:
            self.out.write("\n".join(kept) + "\n")
            self.out.flush()

    def close(self) -> None:
        if self._partial and not is_library_chatter(self._partial):
            self.out.write(self._partial + "\n")
            self.out.flush()
        self._partial = ""


def _follow(client: Any, job_id: str, out: Any) -> None:
    import asyncio

    printer = JobLogPrinter(out)

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            printer.write(chunk)

    asyncio.run(tail())
    printer.close()


# -- the commands -------------------------------------------------------------------------

def check_run_names(args: argparse.Namespace, config_text: str) -> None:
    """The run names the job would carry (--run, the config's `run`), refused here by the
    runs root's rule before anything is submitted."""
    from rlfleet.storage.paths import InvalidRunName, validate_run_name

    named = yaml.safe_load(config_text).get("run")
    for where, run in (("--run", args.run), (f"{args.config}: run", named)):
        if run is None:
            continue
        try:
            validate_run_name(run)
        except InvalidRunName as exc:
            raise SubmitError(f"{where}: {exc}") from None


def _submit(args: argparse.Namespace) -> int:
    config_text = read_config(args.config)
    check_run_names(args, config_text)
    token = fleet_token(args)
    client = connect(args)
    with tempfile.TemporaryDirectory(prefix="rlfleet-submit-") as tmp:
        runtime_env = write_working_dir(Path(tmp), config_text, token, args.stop_grace,
                                        args.console)
        try:
            job_id = client.submit_job(
                entrypoint=entrypoint(args.run, args.resume), runtime_env=runtime_env,
                metadata={"rlfleet": "learner", **({"run": args.run} if args.run else {})})
        except RuntimeError as exc:
            raise SubmitError(f"the Ray Jobs API at {args.address} refused the job: "
                              f"{_first_line(exc)}") from None
    print(job_id, flush=True)
    if not args.wait:
        return 0
    # the job's output goes to stderr: stdout stays the job id alone
    _follow(client, job_id, sys.stderr)
    status = wait_terminal(client, args, job_id, timeout_s=60)
    print(f"job {job_id}: {status}", file=sys.stderr)
    return 0 if status == "SUCCEEDED" else 1


def _logs(args: argparse.Namespace) -> int:
    client = connect(args)
    if args.follow:
        _job_call(args, client.get_job_status, args.job_id)  # a clear error for a bad id
        _follow(client, args.job_id, sys.stdout)
    else:
        printer = JobLogPrinter(sys.stdout)
        printer.write(_job_call(args, client.get_job_logs, args.job_id))
        printer.close()
    return 0


def _status(args: argparse.Namespace) -> int:
    client = connect(args)
    info = _job_call(args, client.get_job_info, args.job_id)
    print(str(info.status.value))
    if info.message:
        print(info.message, file=sys.stderr)
    return 0


def _stop(args: argparse.Namespace) -> int:
    client = connect(args)
    _job_call(args, client.stop_job, args.job_id)  # False: already terminal; fine
    print(wait_terminal(client, args, args.job_id, args.timeout))
    return 0


def _guarded(command: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except SubmitError as exc:
            print(f"rlfleet learner {args.subcommand}: {exc}", file=sys.stderr)
            return 2

    return run


def _address(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", required=True,
                   help="the Ray Jobs API: http://HOST:8265 (the head's dashboard port), "
                        "or an endpoint scheme such as sagemaker_ray://CLUSTER/NAMESPACE")
    ray_tok = p.add_mutually_exclusive_group()
    ray_tok.add_argument("--ray-token-file", default=None,
                         help="Ray's auth token (else RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, "
                              "~/.ray/auth_token)")
    ray_tok.add_argument("--ray-token-secret", default=None, metavar="NAMESPACE/NAME[:KEY]",
                         help="a Kubernetes Secret holding Ray's auth token (current kube "
                              "context; the chart's Ray head uses <release>-ray, key "
                              f"{DEFAULT_SECRET_KEY})")
    p.add_argument("--connect-timeout", type=float, default=0.0, metavar="SECONDS",
                   help="keep trying an address that does not answer for this long "
                        "(default 0: fail at once)")


def register_remote_commands(sub: argparse._SubParsersAction) -> None:
    """Adds submit, logs, status and stop to `rlfleet learner`."""
    p = sub.add_parser("submit", help="submit the learner as a job to a remote Ray cluster")
    _address(p)
    p.add_argument("--config", required=True, help="learner YAML; its content travels "
                                                   "with the job")
    p.add_argument("--run", default=None, help="run name (overrides the config)")
    p.add_argument("--resume", default="none", help="as `rlfleet learner run --resume`")
    token = p.add_mutually_exclusive_group()
    token.add_argument("--token-file", default=None, help="a file holding the fleet token")
    token.add_argument("--token-secret", default=None, metavar="NAMESPACE/NAME[:KEY]",
                       help="a Kubernetes Secret holding the fleet token (current kube "
                            f"context; KEY defaults to {DEFAULT_SECRET_KEY})")
    token.add_argument("--insecure-no-auth", action="store_true",
                       help="no fleet token: the learner runs with RLFLEET_AUTH=none")
    p.add_argument("--stop-grace", type=int, default=300, metavar="SECONDS",
                   help="how long a stop lets the learner checkpoint after SIGTERM before "
                        "Ray kills it")
    p.add_argument("--wait", action="store_true",
                   help="follow the job's logs (on stderr) until it ends; exit 0 only if "
                        "it succeeded")
    p.add_argument("--console", choices=CONSOLE_MODES, default=None,
                   help="the job's log: human (a short line per step; the JSON lines go to "
                        "the run's logs/learner.log) or json (JSON lines); default: the "
                        "cluster's RLFLEET_CONSOLE, else json")
    p.set_defaults(func=_guarded(_submit))

    p = sub.add_parser("logs", help="a submitted learner job's logs")
    p.add_argument("job_id")
    _address(p)
    p.add_argument("--follow", action="store_true", help="stream them until the job ends")
    p.set_defaults(func=_guarded(_logs))

    p = sub.add_parser("status", help="a submitted learner job's status")
    p.add_argument("job_id")
    _address(p)
    p.set_defaults(func=_guarded(_status))

    p = sub.add_parser("stop", help="stop a submitted learner job; prints its final status")
    p.add_argument("job_id")
    _address(p)
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for the job to end")
    p.set_defaults(func=_guarded(_stop))
