#!/usr/bin/env python3
"""Self-check of the netns hosts fixture (not a castmesh test).

    python3 tests/testing/selfcheck_netns_hosts.py

Needs root. Exits 0 on success, 1 on a failed check, 77 if the machine cannot
run the fixture (the reason is printed). Takes a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from netns_hosts import NetnsHosts, NetnsHostsError, skip_reason  # noqa: E402

PORT = 7000

# Accepts forever and answers each connection with its hostname.
SERVER = (
    "import socket\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('0.0.0.0', {PORT})); s.listen(16)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(socket.gethostname().encode()); c.close()\n"
)

# Prints "ok <server hostname>", "timeout" or "error <what>"; never fails.
CLIENT = (
    "import socket, sys\n"
    "try:\n"
    "    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))\n"
    "    print('ok', c.recv(100).decode())\n"
    "except socket.timeout:\n"
    "    print('timeout')\n"
    "except OSError as e:\n"
    "    print('error', e)\n"
)

failures: list[str] = []


def check(cond: bool, what: str) -> None:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def connect(hosts: NetnsHosts, src: int, dst: int, timeout: float = 1.0) -> str:
    out = hosts.run(src, ["python3", "-c", CLIENT, hosts.address(dst), str(PORT), str(timeout)],
                    stdout=subprocess.PIPE, text=True, timeout=timeout + 10)
    return out.stdout.strip()


def connect_until_ok(hosts: NetnsHosts, src: int, dst: int, within: float) -> str:
    deadline = time.monotonic() + within
    while True:
        res = connect(hosts, src, dst, timeout=0.5)
        if res.startswith("ok") or time.monotonic() > deadline:
            return res
        time.sleep(0.05)


def leftovers(prefix: str) -> list[str]:
    ns = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], stdout=subprocess.PIPE, text=True).stdout
    names = [line.split()[0] for line in ns.splitlines() if line.strip()]
    names += [line.split(": ")[1].split("@")[0] for line in links.splitlines() if ": " in line]
    return [x for x in names if x.startswith(prefix + "-")]


def main() -> int:
    why = skip_reason()
    if why is not None:
        print(f"skip: {why}")
        return 77
    t0 = time.monotonic()

    # A crashed earlier run with the same prefix must not get in the way.
    probe = NetnsHosts(n=3)
    subprocess.run(["bash", str(Path(__file__).with_name("netns_hosts.sh")), "up", probe.prefix, "2"],
                   check=True)
    with NetnsHosts(n=3, prefix=probe.prefix) as hosts:
        prefix = hosts.prefix
        print(f"hosts up: {hosts!r}")

        # 1. Own hostname, env var and only the expected addresses.
        for k in hosts.hosts():
            r = hosts.run(k, ["python3", "-c",
                              "import os, socket; print(socket.gethostname(), os.environ['CASTMESH_TEST_HOST'])"],
                          stdout=subprocess.PIPE, text=True, check=True)
            check(r.stdout.split() == [hosts.name(k)] * 2, f"h{k} hostname and CASTMESH_TEST_HOST = {hosts.name(k)}")
            r = hosts.run(k, ["ip", "-o", "addr", "show"], stdout=subprocess.PIPE, text=True, check=True)
            addrs = sorted(line.split()[3] for line in r.stdout.splitlines())
            check(addrs == sorted(["127.0.0.1/8", hosts.address(k) + "/24"]),
                  f"h{k} addresses are exactly lo + {hosts.address(k)}/24 (got {addrs})")
        r = subprocess.run(["ip", "-o", "addr", "show", "dev", f"{prefix}-br"], stdout=subprocess.PIPE, text=True)
        check([line.split()[3] for line in r.stdout.splitlines()] == ["198.18.0.1/24"],
              "bridge has only 198.18.0.1/24 (no IPv6 link-local)")

        # 2. Servers in h2 and h3; Popen.pid is the server's own pid.
        servers = {k: hosts.popen(k, ["python3", "-c", SERVER]) for k in (2, 3)}
        check(connect_until_ok(hosts, 1, 2, within=5) == f"ok {hosts.name(2)}", "h1 -> h2 TCP connect")
        check(connect_until_ok(hosts, 1, 3, within=5) == f"ok {hosts.name(3)}", "h1 -> h3 TCP connect")
        check(servers[2].pid in hosts.pids(2), "popen pid is the command's pid and is listed by pids(2)")
        check(servers[2].pid not in hosts.pids(3), "h2's server is not listed by pids(3)")

        # 3. Partition h2: connects time out (no RST), h1 <-> h3 unaffected.
        hosts.partition(2)
        t = time.monotonic()
        res = connect(hosts, 1, 2, timeout=1.0)
        check(res == "timeout", f"h1 -> h2 times out while partitioned (got {res!r}, {time.monotonic() - t:.1f}s)")
        check(connect(hosts, 1, 3) == f"ok {hosts.name(3)}", "h1 -> h3 still works during the partition")
        res = connect(hosts, 3, 1)
        check("refused" in res, f"h3 -> h1 reaches h1 during the partition (refused, no server there: {res!r})")

        # 4. Heal: connectivity comes back.
        hosts.heal(2)
        t = time.monotonic()
        res = connect_until_ok(hosts, 1, 2, within=5)
        check(res == f"ok {hosts.name(2)}", f"h1 -> h2 works again after heal ({time.monotonic() - t:.2f}s)")

        # 5. Kill everything of h2.
        extra = hosts.popen(2, ["sh", "-c", "sleep 60 & sleep 60"])
        time.sleep(0.2)
        check(len(hosts.pids(2)) >= 3, f"h2 has its processes before kill_all ({hosts.pids(2)})")
        hosts.kill_all(2)
        check(hosts.pids(2) == [], "pids(2) is empty after kill_all(2)")
        check(servers[2].wait(timeout=5) == -9 and extra.wait(timeout=5) == -9, "h2's processes died of SIGKILL")
        check(servers[3].poll() is None, "h3's server is untouched")
        res = connect(hosts, 1, 2)
        check("refused" in res, f"h1 -> h2 is refused now that h2's server is gone ({res!r})")

    check(leftovers(prefix) == [], f"down leaves no namespace/veth/bridge of {prefix} ({leftovers(prefix)})")
    check(servers[3].poll() == -9, "down SIGKILLed h3's server")

    # 6. An exception inside the with block still brings everything down.
    try:
        with NetnsHosts(n=1) as h:
            p2 = h.prefix
            h.popen(1, ["sleep", "60"])
            raise KeyError("boom")
    except KeyError:
        pass
    check(leftovers(p2) == [], "an exception in the with block still runs down")

    # 7. Clear errors.
    try:
        NetnsHosts(n=1, prefix="Bad-Prefix")
        check(False, "invalid prefix is rejected")
    except ValueError:
        check(True, "invalid prefix is rejected")
    try:
        NetnsHosts(n=1).pids(1)
        check(False, "pids of a host that is not up raises NetnsHostsError")
    except NetnsHostsError as e:
        check("no network namespace" in str(e), f"pids of a host that is not up raises: {e}")

    elapsed = time.monotonic() - t0
    check(elapsed < 20, f"finished in {elapsed:.1f}s")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
