"""vLLM's own log lines are JSON lines too: in a process that set up rlfleet.logs (a
rollout replica), in an engine core it forks (vLLM applies its logging configuration
there), and in one it spawns, which reads the configuration that set-up left for it in
VLLM_LOGGING_CONFIG_PATH. Run under the vllm venv's interpreter, where vLLM imports."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rlfleet.engines.vllm import default_venv_python
from rlfleet.logs import COMMON_KEYS

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]

# What an engine core does first: apply vLLM's LoggingConfig (its defaults read
# VLLM_LOGGING_CONFIG_PATH), then log.
ENGINE_CORE = ("from vllm.config.logging import LoggingConfig; "
               "from vllm.logger import configure_logging, init_logger; "
               "configure_logging(LoggingConfig()); "
               "init_logger('vllm.engine_probe').warning('from the {} engine core')")

SCRIPT = f"""
import os, subprocess, sys
from rlfleet.logs import setup_logging
setup_logging("rollout")
from vllm.logger import init_logger
init_logger("vllm.probe").warning("from the replica's vllm")
pid = os.fork()
if pid == 0:
    exec({ENGINE_CORE.format("forked")!r})
    os._exit(0)
os.waitpid(pid, 0)
sys.stderr.flush()
# a process vLLM spawns: no rlfleet set-up, only the environment it inherits; its lines
# go to a file of their own
with open(sys.argv[1], "w") as out:
    subprocess.run([sys.executable, "-c", {ENGINE_CORE.format("spawned")!r}], check=True,
                   stderr=out)
"""


def json_lines(text: str) -> list[dict]:
    docs = []
    for line in text.splitlines():
        if line.strip():
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError:
                pytest.fail(f"not a JSON line: {line!r}")
    return docs


def test_vllm_logs_in_the_replica_and_its_engine_processes_are_json(tmp_path: Path) -> None:
    python = default_venv_python()
    assert python.exists(), (
        f"the vllm venv is missing ({python}): build it with scripts/setup_vllm_venv.sh "
        "(`make vllm-venv`); vllm tests never skip")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_CONFIG_PATH"}
    env.update(PYTHONPATH=str(REPO / "libs"), TMPDIR=str(tmp_path))
    spawned = tmp_path / "spawned.log"
    proc = subprocess.run([str(python), "-c", SCRIPT, str(spawned)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the replica and its forked engine core: every line (torch's and vLLM's too) JSON
    docs = json_lines(proc.stdout + proc.stderr)
    assert all(set(COMMON_KEYS) <= set(d) and d["service"] == "rollout" for d in docs)
    probes = [(d["logger"], d["msg"]) for d in docs if "probe" in d["logger"]]
    assert probes == [("vllm.probe", "from the replica's vllm"),  # once each: no second
                      ("vllm.engine_probe", "from the forked engine core")]  # handler
    # a spawned engine core: vLLM's records through the JSON formatter too (torch's
    # import-time warnings, before vLLM configures anything, are torch's own format)
    lines = [json.loads(line) for line in spawned.read_text().splitlines()
             if line.startswith("{")]
    assert [(d["service"], d["logger"], d["msg"]) for d in lines] == [
        ("rollout", "vllm.engine_probe", "from the spawned engine core")]
