"""Mutual TLS between a controller and a host agent on network-namespace
hosts: what is refused, with the reason on both sides, and rotation
(docs/security.md, "Mutual TLS"; docs/hosts.md).

An agent (``python -m castmesh.host`` with --ca/--cert/--key) runs on host 1,
controllers (tests/python/hosts/controller.py) on host 2. Each refusal is
checked end to end: the controller's exception and the agent's log. The
same refusals between two bare endpoints over loopback are
tests/core/transport/tls_test.cc; a plaintext peer either way and a full
mesh over TLS are tests/python/test_hosts.py. Needs root: skipped with the
reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, Optional

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "testing"))

import controller_process  # noqa: E402
import host_tests  # noqa: E402
import netns_hosts  # noqa: E402
from controller_process import wait_for  # noqa: E402
from host_tests import wait_until  # noqa: E402

SECRET = "castmesh-test-hosts-tls-secret"
PORT = 26640
AGENT_HOST = 1
CONTROLLER_HOST = 2

pytestmark = host_tests.marks()


def _env(**extra: str) -> Dict[str, str]:
    return host_tests.env(SECRET, **extra)


@pytest.fixture(scope="module")
def hosts() -> Iterator["netns_hosts.NetnsHosts"]:
    with netns_hosts.NetnsHosts(n=CONTROLLER_HOST) as made:
        yield made


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test CA with "agent", "agent2" and "controller" certificates, plus
    scripts/make-test-certs.sh's expired, not-yet-valid and other-CA ones."""
    folder = tmp_path_factory.mktemp("certs")
    try:
        subprocess.run([str(HERE.parent.parent / "scripts" / "make-test-certs.sh"), str(folder), "agent", "agent2",
                        "controller"], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot make test certificates (needs the openssl command): {error}")
    return folder


class Agent:
    """A TLS agent on the agent host whose output goes to a file, read
    while it runs."""

    def __init__(self, hosts: "netns_hosts.NetnsHosts", certs: Path, log: Path, cert: str = "agent",
                 key: Optional[str] = None, folder: Optional[Path] = None, **env: str) -> None:
        folder = folder or certs
        self.address = f"tcp://{hosts.address(AGENT_HOST)}:{PORT}"
        self.log_path = log
        with open(log, "w") as out:
            self.proc = hosts.popen(AGENT_HOST, [sys.executable, "-m", "castmesh.host", "--address", self.address,
                                                 "--ca", str(certs / "ca.crt"), "--cert", str(folder / f"{cert}.crt"),
                                                 "--key", str(folder / f"{key or cert}.key")],
                                    env=_env(**env), stdout=out, stderr=subprocess.STDOUT, text=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 15) -> str:
        """The log once it holds `text` (the test fails with the log if it never does)."""
        assert wait_until(lambda: text in self.log(), timeout), f"no '{text}' in the agent's log:\n{self.log()}"
        return self.log()

    def started(self) -> "Agent":
        self.wait_log("listening at")
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def agent_log(tmp_path: Path) -> Path:
    return tmp_path / "agent.log"


def controller(hosts: "netns_hosts.NetnsHosts", scenario: str, address: str, certs: Path,
               **env: str) -> subprocess.Popen:
    """A controller with TLS (TEST_TLS_DIR: the test certificates; `env` may
    pick others) on the controller host."""
    return hosts.popen(CONTROLLER_HOST, [sys.executable, str(HERE / "hosts" / "controller.py"), scenario, address],
                       env=_env(TEST_TLS_DIR=str(certs), **env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)


def attach_error(hosts: "netns_hosts.NetnsHosts", address: str, certs: Path, **env: str) -> str:
    """The controller's exception when its attach must fail."""
    out = controller_process.finish(controller(hosts, "attach-fails", address, certs, **env), 120)
    assert "ERROR" in out, out
    return out


# (controller's certificate, key and CA names; what the controller's exception
# says; what the agent's log says): the agent refuses the controller's
# certificate, or the controller the agent's, and the other side learns why
# from the alert.
REFUSALS = {
    "expired": (dict(TEST_TLS_CERT="expired"),
                ["the peer refused this proc's TLS handshake", "certificate expired"],
                ["this proc refused the peer's certificate (CN=expired)", "certificate has expired"]),
    "not-yet-valid": (dict(TEST_TLS_CERT="not-yet-valid"),
                      ["the peer refused this proc's TLS handshake", "bad certificate"],
                      ["this proc refused the peer's certificate (CN=not-yet-valid)",
                       "certificate is not yet valid"]),
    "signed-by-another-ca": (dict(TEST_TLS_CERT="other-ca-host"),
                             ["the peer refused this proc's TLS handshake", "unknown ca"],
                             ["this proc refused the peer's certificate (CN=other-ca-host)",
                              "unable to get local issuer certificate"]),
    # (the agent sends its chain up to the test CA, which the controller
    # does not trust)
    "trusts-another-ca": (dict(TEST_TLS_CA="other-ca"),
                          ["this proc refused the peer's certificate (CN=agent)",
                           "self-signed certificate in certificate chain"],
                          ["the peer refused this proc's TLS handshake", "unknown ca"]),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_bad_certificate_is_refused_with_the_reason_on_both_sides(hosts, certs, agent_log, case) -> None:
    env, controller_says, agent_says = REFUSALS[case]
    with Agent(hosts, certs, agent_log) as agent:
        agent.started()
        out = attach_error(hosts, agent.address, certs, **env)
        for text in controller_says:
            assert text in out, out
        for text in agent_says:
            agent.wait_log(text)
        assert agent.proc.poll() is None, "the agent serves on"


@pytest.mark.timeout(120)
def test_client_without_a_certificate_is_refused(hosts, certs, agent_log) -> None:
    # castmesh never dials TLS without a certificate (attach_to_workers
    # refuses incomplete credentials: test_hosts.py), so a bare TLS 1.3
    # client plays the controller that has none.
    client = (
        "import socket, ssl, sys\n"
        "ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); ctx.minimum_version = ssl.TLSVersion.TLSv1_3\n"
        f"ctx.load_verify_locations({str(certs / 'ca.crt')!r}); ctx.check_hostname = False\n"
        f"s = ctx.wrap_socket(socket.create_connection(({hosts.address(AGENT_HOST)!r}, {PORT}), timeout=20))\n"
        "try:\n"
        "    s.recv(1)\n"  # TLS 1.3: the server's refusal arrives after the client's handshake
        "    print('NOT REFUSED')\n"
        "except ssl.SSLError as error:\n"
        "    print('REFUSED', error)\n")
    with Agent(hosts, certs, agent_log) as agent:
        agent.started()
        run = hosts.run(CONTROLLER_HOST, [sys.executable, "-c", client], capture_output=True, text=True, timeout=60)
        assert "REFUSED" in run.stdout and "certificate required" in run.stdout.lower(), run.stdout + run.stderr
        agent.wait_log("peer did not return a certificate")


@pytest.mark.timeout(120)
def test_mismatched_key_stops_either_side_before_any_connection(hosts, certs, agent_log) -> None:
    # The controller: its attach fails at once, naming both files.
    with Agent(hosts, certs, agent_log) as agent:
        agent.started()
        out = attach_error(hosts, agent.address, certs, TEST_TLS_KEY="agent")
        assert "does not match the certificate" in out and "agent.key" in out, out
    assert "unauthenticated peer" not in agent.log(), "the controller never dialed"
    # The agent: it does not start.
    with Agent(hosts, certs, agent_log, key="controller") as agent:
        assert agent.proc.wait(timeout=60) != 0
        log = agent.log()
        assert "does not match the certificate" in log and "controller.key" in log, log
        assert "listening at" not in log, log


@pytest.mark.timeout(120)
def test_valid_certificate_with_the_wrong_secret_is_refused(hosts, certs, agent_log) -> None:
    with Agent(hosts, certs, agent_log) as agent:
        agent.started()
        out = attach_error(hosts, agent.address, certs, CASTMESH_SECRET="not-the-mesh-secret")
        assert "proof of the mesh secret" in out, out
        agent.wait_log("wrong mesh secret")


def rotate(folder: Path, certs: Path, name: str) -> None:
    """Replaces folder/agent.{key,crt} with certificate `name` the way
    docs/security.md says: new files renamed over the old ones."""
    for ext in ("key", "crt"):
        staged = folder / f".agent.{ext}.new"
        shutil.copyfile(certs / f"{name}.{ext}", staged)
        staged.chmod(0o600 if ext == "key" else 0o644)
        os.replace(staged, folder / f"agent.{ext}")


@pytest.mark.timeout(180)
def test_rotated_certificate_serves_new_connections_without_restarting_the_agent(hosts, certs, agent_log,
                                                                                 tmp_path: Path) -> None:
    folder = tmp_path / "rotating"
    folder.mkdir()
    rotate(folder, certs, "agent")
    # (info: the agent logs each reload)
    with Agent(hosts, certs, agent_log, folder=folder, CASTMESH_LOG="info") as agent:
        agent.started()
        # A controller and its proc on the agent's host, connected before the rotation.
        first = controller(hosts, "call-across-rotation", agent.address, certs)
        wait_for(first, "READY")
        # An expired certificate replaces the agent's: the open connections
        # go on; a new controller refuses the agent's new certificate.
        rotate(folder, certs, "expired")
        assert first.stdin is not None
        first.stdin.write("go\n")
        first.stdin.flush()
        controller_process.finish(first, 120)
        out = attach_error(hosts, agent.address, certs)
        assert "this proc refused the peer's certificate (CN=expired)" in out, out
        assert "certificate has expired" in out, out
        agent.wait_log("the peer refused this proc's TLS handshake")
        # A valid new certificate: new connections (the controller's, and
        # its proc's, which reads the same files) are served again.
        rotate(folder, certs, "agent2")
        controller_process.finish(controller(hosts, "attach", agent.address, certs), 120)
        log = agent.wait_log("new connections use the new certificate")
        assert agent.proc.poll() is None, log
