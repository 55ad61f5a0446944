"""Fixtures shared by the test suite: local process groups, a real env service; and the
suite's own rules: deadlines scaled by one factor (tests/waits.py), a per-test time-out
that names a hung test, and no process left behind (tests/leaks.py)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlfleet.local.marks import boot_ticks
from rlfleet.local.procs import PORT_BLOCK_ENV, Proc, ProcessGroup, free_port, rlfleet_argv
from tests import leaks
from tests.waits import ENV as WAIT_SCALE_ENV
from tests.waits import SCALE, ray_startup_env, scaled

# tests/vllm run under the vllm venv's interpreter, where vLLM imports; the main venv runs
# them there through tests/integration/test_vllm_engine.py.
collect_ignore = [] if importlib.util.find_spec("vllm") else ["vllm"]

# Tests never reach a hub: models and tokenizers are built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# On 2 shared cores one intra-op thread per process is far faster than several
# contending ones; child processes (services) inherit this.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Services refuse to start without the fleet's token unless auth is turned off explicitly;
# the suite's fleets run without it (loopback only) unless a test gives a token, which
# always turns auth on (tests/reliability/test_security.py).
os.environ.setdefault("RLFLEET_AUTH", "none")
# Ray's start-up waits, scaled like the suite's own (tests/waits.py); set before any test
# module imports ray, which reads some of them at import.
for _name, _value in ray_startup_env().items():
    os.environ.setdefault(_name, _value)


def pytest_report_header(config: pytest.Config) -> str:
    return f"waits scaled by {SCALE:g} ({WAIT_SCALE_ENV})"


def pytest_configure(config: pytest.Config) -> None:
    # Every process this pytest process starts inherits the mark (xdist workers set their
    # own), so what outlives the session can be found, whoever its parent was by then.
    leaks.mark_this_session()
    if not config.pluginmanager.has_plugin("process-origins"):
        config.pluginmanager.register(ProcessOrigins(), "process-origins")
    # each xdist worker (gw0, gw1, ...) starts its services on ports of its own block
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    os.environ[PORT_BLOCK_ENV] = worker.removeprefix("gw") if worker.startswith("gw") else "0"


HEAVY_GROUP = "heavy"


def _group_the_heavy_tiers(items: list[pytest.Item]) -> None:
    """The heavy tiers (the in-cluster fleet, the vLLM tier, a multi-node Ray: marked
    heavy or vllm) each take the machine; two at once starved a Ray start past its
    time-outs. They share one xdist group, so one worker runs them one after another while
    the others run the rest. xdist names an item's group after all its xdist_group marks:
    each heavy item gets every group any of them has, so a group of its own (an older
    `xdist_group("vllm")`) does not take it off that worker."""
    heavy = [item for item in items
             if item.get_closest_marker("heavy") or item.get_closest_marker("vllm")]
    groups = {HEAVY_GROUP} | {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for item in heavy for mark in item.iter_markers("xdist_group")}
    for item in heavy:
        has = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
               for mark in item.iter_markers("xdist_group")}
        for name in sorted(groups - has):
            item.add_marker(pytest.mark.xdist_group(name))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """xdist groups by marker, and the per-test time-out (pyproject's `timeout`, or a
    test's own mark) scaled like every other deadline; pytest-timeout reads the closest
    mark, so this one wins."""
    default = float(config.getini("timeout") or 0)
    if config.pluginmanager.hasplugin("xdist"):  # not in the vLLM venv's pytest
        _group_the_heavy_tiers(items)
    for item in items:
        mark = item.get_closest_marker("timeout")
        base = float(mark.args[0]) if mark and mark.args else default
        if base:
            item.add_marker(pytest.mark.timeout(scaled(base)), append=False)


def _module_of(node: pytest.Item | pytest.Collector) -> str:
    module = node.getparent(pytest.Module)
    return module.nodeid if module is not None else leaks.SESSION


def _shares_module_fixtures(item: pytest.Item) -> bool:
    """Whether `item` uses a class- or module-scoped fixture: a fleet or a cluster the
    module's tests share, which may own processes started during a test (a replica added
    to a shared stack)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return True
    return any(defs and defs[-1].scope in ("class", "module")
               for defs in info.name2fixturedefs.values())


class ProcessOrigins:
    """What each test and fixture starts carries its origin (tests/leaks.py), and what had
    to end with a test or its module is checked when they end. A plugin of its own, not
    conftest hooks: pytest asks a session-scoped fixture's set-up of the plugins at the
    root only."""

    def __init__(self) -> None:
        self.module_since: dict[str, int] = {}  # when this worker began a run of a module
        self.test_since = 0

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> object:
        """What a test starts, set-up to tear-down, carries its node id."""
        now = boot_ticks()
        self.module_since.setdefault(_module_of(item), now)
        self.test_since = now
        with leaks.LEDGER.under(leaks.Origin(item.nodeid, item.nodeid, _module_of(item))):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef,
                             request: pytest.FixtureRequest) -> object:
        """What a wider-scoped fixture starts carries its name and the test it was set up
        for, and may live as long as its scope."""
        test = leaks.LEDGER.current.test
        if fixturedef.scope == "function" or not test:
            return (yield)
        scope = _module_of(request.node) if fixturedef.scope in ("class", "module") \
            else leaks.SESSION
        label = f"{test} (its fixture {fixturedef.argname}, {fixturedef.scope}-scoped)"
        with leaks.LEDGER.under(leaks.Origin(label, test, scope)):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> object:
        """After a test's tear-down, the processes that had to end with it: its own,
        unless it shares its module's fixtures; and once the module's fixtures are torn
        down (the next test is another module's), everything the module's tests and
        fixtures started. At the session's end, no_process_left_behind checks the rest."""
        try:
            return (yield)
        finally:
            if nextitem is not None:
                self._check(item, nextitem)

    def _check(self, item: pytest.Item, nextitem: pytest.Item) -> None:
        module = _module_of(item)
        own = not _shares_module_fixtures(item)
        module_ended = _module_of(nextitem) != module
        since = self.module_since.pop(module) if module_ended else self.test_since
        if not (own or module_ended):
            return
        left = leaks.end_left(lambda o: (own and o.label == item.nodeid)
                              or (module_ended and o.scope == module),
                              grace_s=scaled(20), since=max(0, since - 1))
        if left:
            raise AssertionError(leaks.describe(
                left, "after its module's fixtures were torn down" if module_ended
                else "after its test"))


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Set up first, torn down last: after every other fixture has stopped what it
    started, nothing this session started may still run."""
    yield
    leaks.assert_none_left(grace_s=scaled(20))


FORKSERVER_SWITCH = "RLFLEET_TEST_FORKSERVER"


@pytest.fixture(scope="session", autouse=True)
def forkserver(no_process_left_behind: None,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One fork server per worker (rlfleet.local.forkserver): the services and learners
    the suite's ProcessGroups start fork from a process that has imported torch and
    transformers once, instead of each importing them (~9 CPU-s a process, over a hundred
    processes). RLFLEET_TEST_FORKSERVER=0 starts every process plainly. Not in the vLLM
    venv's own pytest (tests/vllm), which starts no rlfleet processes."""
    if os.environ.get(FORKSERVER_SWITCH, "1") == "0" or importlib.util.find_spec("vllm"):
        yield
        return
    from rlfleet.local.forkserver import FORKSERVER_ENV, ForkServer

    root = tmp_path_factory.mktemp("forkserver")
    server = ForkServer.start(root / "server.sock", root / "server.log",
                              timeout_s=scaled(180))
    os.environ[FORKSERVER_ENV] = str(server.socket_path)
    yield
    os.environ.pop(FORKSERVER_ENV, None)
    server.close()


@pytest.fixture(scope="session", autouse=True)
def vllm_sockets_in_the_session_temp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """vLLM names its engine's ZMQ IPC sockets by uuid under VLLM_RPC_BASE_PATH (default
    /tmp) and a killed engine leaves them there: the suite's go to its own temp folder,
    which pytest prunes. Child processes (the vLLM tier's own pytest) inherit it."""
    if "VLLM_RPC_BASE_PATH" not in os.environ:
        os.environ["VLLM_RPC_BASE_PATH"] = str(tmp_path_factory.mktemp("vllm-ipc"))


@pytest.fixture(autouse=True)
def no_learner_outlives_its_test() -> Iterator[None]:
    """A test that failed with its learner process running (tests.factories'
    learner_process) kills it, Ray and all, instead of leaving it to the session's end."""
    yield
    factories = sys.modules.get("tests.factories")  # not imported: no learner started
    if factories is not None:
        factories.kill_started_learners()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path / "logs", wait_scale=SCALE)
    yield group
    group.stop_all(grace_s=5)


@pytest.fixture
def start_env(procs: ProcessGroup) -> Callable[..., Proc]:
    """Starts `rlfleet env serve` as a real process; returns it once SERVING."""

    def start(*extra: str, name: str = "env", env: dict[str, str] | None = None) -> Proc:
        port = free_port()
        argv = rlfleet_argv("env", "serve", "--port", str(port), "--metrics-port",
                            str(free_port()), *extra)
        return procs.start_service(name, argv, f"127.0.0.1:{port}", env=env)

    return start


@pytest.fixture
def redis_url(procs: ProcessGroup) -> str:
    """A real redis-server on loopback for this test."""
    from rlfleet.local.redis import start_redis

    _, url = start_redis(procs)
    return url


@pytest.fixture
def start_ckptsync(procs: ProcessGroup, tmp_path: Path) -> Callable[..., Proc]:
    def start(redis_url: str, runs_root: Path, *extra: str, name: str = "ckptsync") -> Proc:
        port = free_port()
        argv = rlfleet_argv("ckptsync", "serve", "--port", str(port), "--metrics-port",
                            str(free_port()), "--redis-url", redis_url, "--runs-root",
                            str(runs_root), *extra)
        return procs.start_service(name, argv, f"127.0.0.1:{port}")

    return start


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Qwen3-VL base, built once per machine into the cache."""
    from rlfleet.defaults import cache_dir
    from rlfleet.policy import ensure_tiny_model

    return ensure_tiny_model(cache_dir())


@pytest.fixture
def start_rollout(procs: ProcessGroup, tiny_model_dir: Path) -> Callable[..., Proc]:
    """Starts `rlfleet rollout serve` (hf engine, tiny model) as a real process."""

    def start(env_address: str, *extra: str, name: str = "rollout",
              redis_url: str = "", runs_root: Path | None = None, run: str = "test",
              replica_id: str | None = None, wait: bool = True) -> Proc:
        port = free_port()
        argv = rlfleet_argv(
            "rollout", "serve", "--port", str(port), "--metrics-port", str(free_port()),
            "--model", str(tiny_model_dir), "--env-address", env_address,
            "--run", run, "--replica-id", replica_id or name, "--heartbeat-s", "0.5",
            "--heartbeat-ttl-s", "3",
            *(["--redis-url", redis_url] if redis_url else []),
            *(["--runs-root", str(runs_root)] if runs_root else []), *extra)
        address = f"127.0.0.1:{port}"
        if not wait:
            return procs.start(name, argv, address=address)
        return procs.start_service(name, argv, address, timeout_s=180)

    return start
