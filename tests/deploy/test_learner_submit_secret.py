"""`rlfleet learner submit --token-secret NAMESPACE/NAME[:KEY]` reads the fleet token from a
Secret of a real Kubernetes API server (the current kube context), and says in one line
when the Secret or its key is missing. (The job the token then travels with is tested
against a real Ray head in tests/integration/test_learner_submit.py.)"""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.local.procs import free_port

from .conftest import BUILD_TIMEOUT_S, Cluster, _run

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(BUILD_TIMEOUT_S)]


def test_the_fleet_token_comes_from_a_secret(cluster: Cluster, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from rlfleet_learner.submit import SubmitError, token_from_secret

    token, other = "fleet-" + secrets.token_hex(8), "other-" + secrets.token_hex(8)
    ns = cluster.namespace
    if not cluster.exists("namespace", ns):  # the context's namespace; make deploy makes it
        _run([cluster.kubectl, "create", "namespace", ns], env=cluster.env)
    _run([cluster.kubectl, "-n", ns, "create", "secret", "generic", "submit-auth",
          f"--from-literal=token={token}\n", f"--from-literal=alt={other}"], env=cluster.env)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    assert token_from_secret(f"{ns}/submit-auth") == token  # key "token", as the chart's
    assert token_from_secret(f"{ns}/submit-auth:alt") == other
    with pytest.raises(SubmitError, match=f"no Secret nope in namespace {ns}"):
        token_from_secret(f"{ns}/nope")
    with pytest.raises(SubmitError, match=r"has no key 'missing' \(it has: alt, token\)"):
        token_from_secret(f"{ns}/submit-auth:missing")
    with pytest.raises(SubmitError, match="NAMESPACE/NAME"):
        token_from_secret("submit-auth")

    # the command: one line, exit 2, before any Ray address is tried
    config = tmp_path / "learner.yaml"
    config.write_text("run: r\n")
    out = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "learner", "submit", "--address",
         f"http://127.0.0.1:{free_port()}", "--config", str(config), "--token-secret",
         f"{ns}/nope"], env=cluster.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == (f"rlfleet learner submit: no Secret nope in namespace {ns}")
