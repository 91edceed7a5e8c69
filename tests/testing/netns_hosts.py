"""Simulated hosts for castmesh tests: Python wrapper around netns_hosts.sh.

Each host is a Linux network namespace with its own hostname (UTS namespace)
and one address in 198.18.0.0/24, all joined by a bridge the fixture creates
and removes. See README.md in this folder and the header of netns_hosts.sh.

    from netns_hosts import NetnsHosts, skip_reason

    if (why := skip_reason()) is not None:
        pytest.skip(why)
    with NetnsHosts(n=3) as hosts:
        server = hosts.popen(2, ["python3", "-m", "http.server", "8000"])
        hosts.run(1, ["curl", f"http://{hosts.address(2)}:8000/"], check=True)
        hosts.partition(2)   # packets to/from h2 vanish
        hosts.heal(2)
        hosts.kill_all(2)    # SIGKILL every process of h2

Only the standard library is used so the module can be copied or imported
from any test setup (pytest via sys.path, a Slurm harness, a script).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Mapping, Optional, Sequence

__all__ = ["NetnsHosts", "NetnsHostsError", "skip_reason", "SCRIPT", "SUBNET"]

SCRIPT = Path(__file__).resolve().with_name("netns_hosts.sh")
SUBNET = "198.18.0.0/24"
MAX_HOSTS = 244  # host k has 198.18.0.(10+k); 254 is the last usable address

_PREFIX_RE = re.compile(r"^[a-z0-9]{1,8}$")
_instance_counter = itertools.count()
_skip_reason_cache: Optional[list] = None


class NetnsHostsError(RuntimeError):
    """A netns_hosts.sh subcommand failed; the message carries its stderr."""


def _script(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess:
    # Run through bash explicitly so a lost executable bit does not matter.
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args],
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        text=True,
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip()
        raise NetnsHostsError(
            f"netns_hosts.sh {' '.join(args)} failed (exit {proc.returncode})"
            + (f": {detail}" if detail else "")
        )
    return proc


def skip_reason() -> Optional[str]:
    """None if this machine can run the fixture, else a reason for pytest.skip.

    The answer is cached: the check creates and deletes a throwaway namespace.
    """
    global _skip_reason_cache
    if _skip_reason_cache is None:
        if sys.platform != "linux":
            reason: Optional[str] = f"network namespaces need Linux, not {sys.platform}"
        elif os.geteuid() != 0:
            reason = "not root (network namespaces and bridges need root)"
        else:
            try:
                proc = _script("check", check=False)
            except OSError as e:  # no bash
                reason = f"cannot run netns_hosts.sh: {e}"
            else:
                reason = None
                if proc.returncode != 0:
                    reason = (proc.stdout or proc.stderr or "").strip() or (
                        f"netns_hosts.sh check failed (exit {proc.returncode})"
                    )
        _skip_reason_cache = [reason]
    return _skip_reason_cache[0]


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def default_prefix() -> str:
    """A prefix unique to this process and fixture instance, at most 8 chars.

    "cm" + pid in base 36 (at most 5 chars: pid_max is at most 2**22) + one
    base-36 instance counter, so concurrent test processes never collide and
    one process can hold several fixtures. A crashed process's leftovers are
    removed when a later process that gets the same pid brings its fixture up.
    """
    return "cm" + _base36(os.getpid()) + _base36(next(_instance_counter) % 36)


def _down_quietly(prefix: str) -> None:
    # Safety net for atexit/finalizers: never raise during interpreter exit.
    try:
        _script("down", prefix, check=False)
    except Exception:  # noqa: BLE001
        pass


class NetnsHosts:
    """N simulated hosts; use as a context manager (down runs on exit)."""

    def __init__(self, n: int = 3, prefix: Optional[str] = None):
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"n must be in 1..{MAX_HOSTS}, got {n}")
        prefix = default_prefix() if prefix is None else prefix
        if not _PREFIX_RE.match(prefix):
            raise ValueError(
                f"invalid prefix {prefix!r}: use 1-8 characters of [a-z0-9] "
                "(interface names must fit 15 chars)"
            )
        self.n = n
        self.prefix = prefix
        self._up = False
        self._children: list[subprocess.Popen] = []
        self._finalizer: Optional[weakref.finalize] = None

    # ---- lifecycle ---------------------------------------------------------

    def up(self) -> "NetnsHosts":
        if self._up:
            return self
        # `up` removes stale objects of this prefix first (a crashed run).
        # Register the safety net before creating anything, so a failure half
        # way (or the process exiting without __exit__) still cleans up.
        # weakref.finalize runs at interpreter exit (atexit) or on collection.
        self._finalizer = weakref.finalize(self, _down_quietly, self.prefix)
        _script("up", self.prefix, str(self.n))
        self._up = True
        return self

    def down(self) -> None:
        """Kill every process of every host and remove all objects; idempotent."""
        try:
            _script("down", self.prefix)
        finally:
            self._up = False
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            # Reap the Popen objects we handed out (they were SIGKILLed by
            # down) so they do not linger as zombies or warn at exit.
            for child in self._children:
                try:
                    child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            self._children.clear()

    def __enter__(self) -> "NetnsHosts":
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc) -> None:
        self.down()

    # ---- naming ------------------------------------------------------------

    def _check_k(self, k: int) -> int:
        if not isinstance(k, int) or not 1 <= k <= self.n:
            raise ValueError(f"host number must be in 1..{self.n}, got {k!r}")
        return k

    def name(self, k: int) -> str:
        """Namespace name and hostname of host k, e.g. 'cmab12-h2'."""
        return f"{self.prefix}-h{self._check_k(k)}"

    def address(self, k: int) -> str:
        """IPv4 address of host k: 198.18.0.(10+k)."""
        return f"198.18.0.{10 + self._check_k(k)}"

    @property
    def bridge_address(self) -> str:
        """Address of the bridge in the root namespace."""
        return "198.18.0.1"

    def hosts(self) -> range:
        return range(1, self.n + 1)

    # ---- processes ---------------------------------------------------------

    def _argv(self, k: int, argv: Sequence[str]) -> list[str]:
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a sequence of arguments, not a string")
        if not argv:
            raise ValueError("argv must not be empty")
        return ["bash", str(SCRIPT), "exec", self.prefix, str(self._check_k(k)), "--", *map(str, argv)]

    @staticmethod
    def _env(env: Optional[Mapping[str, str]]) -> Optional[dict]:
        # Same meaning as subprocess's env= (the whole environment), except that
        # PATH is kept when missing: the script needs it to find ip/unshare.
        if env is None:
            return None
        env = dict(env)
        env.setdefault("PATH", os.environ.get("PATH", os.defpath))
        return env

    def popen(self, k: int, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
              **popen_kwargs) -> subprocess.Popen:
        """Start argv inside host k; Popen.pid is the command's own pid.

        The command sees CASTMESH_TEST_HOST=<name(k)> and hostname name(k).
        """
        if not self._up:
            raise NetnsHostsError("hosts are not up (use 'with NetnsHosts(...) as hosts:')")
        proc = subprocess.Popen(self._argv(k, argv), env=self._env(env), **popen_kwargs)
        self._children.append(proc)
        return proc

    def run(self, k: int, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
            **run_kwargs) -> subprocess.CompletedProcess:
        """subprocess.run of argv inside host k (timeout= kills the command)."""
        if not self._up:
            raise NetnsHostsError("hosts are not up (use 'with NetnsHosts(...) as hosts:')")
        return subprocess.run(self._argv(k, argv), env=self._env(env), **run_kwargs)

    def pids(self, k: int) -> list[int]:
        """Pids of every process whose network namespace is host k's."""
        out = _script("pids", self.prefix, str(self._check_k(k))).stdout
        return sorted(int(p) for p in out.split())

    def kill_all(self, k: int) -> None:
        """SIGKILL every process of host k (retries until none is left)."""
        _script("kill", self.prefix, str(self._check_k(k)))
        for child in self._children:
            child.poll()  # reap ours now, so pids() and callers see them gone

    # ---- network faults ----------------------------------------------------

    def partition(self, k: int) -> None:
        """Cut host k off: its packets vanish (no RST, no ICMP), like a pulled cable."""
        _script("partition", self.prefix, str(self._check_k(k)))

    def heal(self, k: int) -> None:
        """Reconnect host k after partition()."""
        _script("heal", self.prefix, str(self._check_k(k)))

    def __repr__(self) -> str:
        state = "up" if self._up else "down"
        return f"NetnsHosts(n={self.n}, prefix={self.prefix!r}, {state})"

