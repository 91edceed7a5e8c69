"""Built-in metrics and user meters (castmesh.metrics, castmesh.get_meter;
docs/observability.md, "Metrics") on real worker procs: counts match the
calls made, an allreduce is counted once per rank with its bytes, the
data-plane path it took has bytes, user meters show up, and
``python -m castmesh top --once`` prints a table with every proc as a
read-only observer (and fails clearly with a wrong secret)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Dict, Iterator

import pytest

import castmesh
from castmesh import Actor, collectives, endpoint, this_host

np = pytest.importorskip("numpy")

N = 256  # float32 elements per allreduce


class Counted(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def bump(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def reduce_once(self) -> float:
        comm = collectives.current()
        x = np.ones(N, dtype=np.float32)
        comm.allreduce(x)
        castmesh.get_meter("test_metrics").create_counter("reduced").add(1, {"rank": comm.rank})
        castmesh.get_meter("test_metrics").create_histogram("sizes", unit="elements").record(N)
        return float(x[0])


@pytest.fixture(scope="module")
def procs() -> Iterator[castmesh.ProcMesh]:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    yield procs
    procs.stop().get(timeout=60)


@pytest.fixture(scope="module")
def counted(procs: castmesh.ProcMesh) -> castmesh.ActorMesh[Counted]:
    return procs.spawn("counted", Counted)


def _settled(mesh: castmesh.ActorMesh[Counted]) -> Any:
    """The mesh's metrics once every delivered message's run is counted (a
    run is counted when its handler returns, which may be after its answer
    arrived): bounded wait."""
    deadline = time.monotonic() + 10
    while True:
        got = castmesh.metrics(mesh)
        if all(got[i]["meshes"]["counted"]["handler_count"] == got[i]["meshes"]["counted"]["messages_in"]
               for i in range(len(got))) or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


def _allreduce_calls(proc: Dict[str, Any]) -> Dict[str, int]:
    calls = bytes_ = 0
    for c in proc["communicators"]:
        k = c["collectives"].get("allreduce")
        if k:
            calls += k["calls"]
            bytes_ += k["bytes"]
    return {"calls": calls, "bytes": bytes_}


def test_ten_calls_to_one_actor_are_ten_messages_in_and_ten_handler_runs(
        counted: castmesh.ActorMesh[Counted]) -> None:
    before = _settled(counted)
    for _ in range(10):
        counted.slice(gpus=1).bump.call_one().get(timeout=30)
    after = _settled(counted)
    assert len(after) == 2
    for position in range(2):
        assert after[position]["error"] is None
        old, new = before[position]["meshes"]["counted"], after[position]["meshes"]["counted"]
        expected = 10 if position == 1 else 0
        assert new["messages_in"] - old["messages_in"] == expected
        assert new["handler_count"] - old["handler_count"] == expected
        assert new["mailbox_depth"] == 0
        assert sum(new["handler_buckets"]) == new["handler_count"]
        actor = next(a for a in after[position]["actors"] if a["name"] == "counted")
        assert actor["index"] == position
        # Summed over transports: the procs talk over Unix sockets by default,
        # but a suite run in one process (the wheel stage) may have set TCP.
        assert _over_transports(after[position], "bytes_in") > 0
    assert _over_transports(after[1], "messages_in") - _over_transports(before[1], "messages_in") >= 10


def _over_transports(proc: dict, field: str) -> int:
    return sum(counters[field] for counters in proc["transports"].values())


def test_an_allreduce_is_counted_once_per_rank_with_its_bytes_and_path(
        counted: castmesh.ActorMesh[Counted]) -> None:
    counted.reduce_once.call().get(timeout=60)  # the communicator exists from here on
    before = castmesh.metrics(counted)
    assert counted.reduce_once.call().get(timeout=60).values() is not None
    after = castmesh.metrics(counted)
    for position in range(2):
        old, new = _allreduce_calls(before[position]), _allreduce_calls(after[position])
        assert new["calls"] - old["calls"] == 1
        assert new["bytes"] - old["bytes"] == N * 4
        moved = {name: f["bytes_out"] - before[position]["paths"].get(name, {"bytes_out": 0})["bytes_out"]
                 for name, f in after[position]["paths"].items()}
        assert sum(moved.values()) > 0, after[position]["paths"]
        assert set(moved) <= {"in_process", "shm_ring", "single_copy", "socket", "shared_segment", "ibverbs",
                              "device_staging"}


def test_user_meters_show_up_in_their_procs_snapshot(counted: castmesh.ActorMesh[Counted]) -> None:
    counted.reduce_once.call().get(timeout=60)
    after = castmesh.metrics(counted)
    for position in range(2):
        meters = after[position]["meters"]["test_metrics"]
        reduced = meters["reduced"]
        assert reduced["kind"] == "counter"
        assert reduced["value"] >= 1
        assert [s["attributes"] for s in reduced["series"]] == [{"rank": str(position)}]
        sizes = meters["sizes"]
        assert sizes["kind"] == "histogram" and sizes["unit"] == "elements"
        assert sizes["count"] >= 1 and sizes["sum"] == sizes["count"] * N


def test_meters_in_this_process_and_bad_values() -> None:
    meter = castmesh.get_meter("test_metrics_here")
    counter = meter.create_counter("events")
    counter.add(2)
    counter.add(3, {"kind": "a"})
    mine = castmesh.meters.this_process()["meters"]["test_metrics_here"]["events"]
    assert mine["value"] == 5
    with pytest.raises(ValueError):
        counter.add(-1)
    with pytest.raises(ValueError):
        meter.create_histogram("events")  # a counter already has that name
    with pytest.raises(ValueError):
        castmesh.get_meter("")


def test_opentelemetry_receives_the_meters_when_installed() -> None:
    try:
        from opentelemetry.sdk.metrics import MeterProvider  # type: ignore[import-not-found]
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # type: ignore[import-not-found]
        from opentelemetry import metrics as otel_metrics  # type: ignore[import-not-found]
    except ImportError:
        pytest.skip("opentelemetry-api/-sdk are not installed: forwarding to OpenTelemetry is optional")
    reader = InMemoryMetricReader()
    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    castmesh.get_meter("test_metrics_otel").create_counter("forwarded").add(7)
    data = reader.get_metrics_data()
    names = [m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    assert "forwarded" in names


def _top(address: str, secret: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CASTMESH_SECRET=secret)
    return subprocess.run([sys.executable, "-m", "castmesh", "top", address, "--once", "--timeout", "10", *extra],
                          env=env, capture_output=True, text=True, timeout=120)


def test_top_once_prints_every_proc_as_an_observer(counted: castmesh.ActorMesh[Counted],
                                                   procs: castmesh.ProcMesh) -> None:
    counted.bump.call().get(timeout=30)
    target = castmesh.observer_target()
    done = _top(target["address"], target["secret"])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert target["address"] in out  # the controller's own row
    snapshot = castmesh.metrics(procs)
    for position in range(len(snapshot)):
        assert snapshot[position]["proc_id"] in out, out  # every worker proc's row
    assert "actor meshes" in out and "counted" in out, out
    assert "allreduce" in out or "collectives" not in out


def test_top_with_a_wrong_secret_fails_clearly() -> None:
    target = castmesh.observer_target()
    done = _top(target["address"], "0" * 64)
    assert done.returncode == 1
    assert "cannot observe" in done.stderr, done.stderr
