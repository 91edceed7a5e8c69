"""Built-in metrics of running procs and meters for user code
(docs/observability.md, "Metrics").

``castmesh.metrics(mesh)`` returns, for every proc of a ProcMesh (or of the
procs an ActorMesh runs on), a ValueMesh of dicts with the proc's always-on
counters: per actor and per actor mesh (messages in and out, mailbox depth,
handler time), per transport and per data-plane path (messages and bytes),
per communicator (calls and bytes per collective kind), and its user meters.

``castmesh.get_meter(name)`` gives meters with OpenTelemetry's API names::

    requests = castmesh.get_meter("trainer").create_counter("batches")
    requests.add(1, {"split": "train"})
    castmesh.get_meter("trainer").create_histogram("loss").record(0.25)

Their values appear under ``"meters"`` in the snapshot of the proc that
recorded them. When ``opentelemetry-api`` is installed, every add/record
also goes to OpenTelemetry's meter of the same name (whatever provider the
process configured; none configured: OpenTelemetry drops them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Union

from . import _castmesh

if TYPE_CHECKING:
    from .actor_mesh import ActorMesh
    from .proc_mesh import ProcMesh
    from .shape import ValueMesh

__all__ = ["metrics", "this_process", "get_meter", "Meter", "Counter", "Histogram", "Observer", "observer_target"]

Attributes = Optional[Mapping[str, Union[str, bool, int, float]]]


def _attributes_key(attributes: Attributes) -> str:
    if not attributes:
        return ""
    for key in attributes:
        if not isinstance(key, str) or "=" in key or "," in key:
            raise ValueError(f"attribute names are strings without '=' or ',': {key!r}")
    return ",".join(f"{k}={attributes[k]}" for k in sorted(attributes))


def _parse_attributes(key: str) -> Dict[str, str]:
    if not key:
        return {}
    return dict(part.split("=", 1) for part in key.split(","))


def _aggregate_meshes(actors: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per actor name (an actor mesh's actors share their mesh's name): sums,
    and the largest mailbox."""
    meshes: Dict[str, Dict[str, Any]] = {}
    for a in actors:
        m = meshes.setdefault(a["name"], {"actors": 0, "messages_in": 0, "messages_out": 0, "mailbox_depth": 0,
                                          "mailbox_max": 0, "handler_count": 0, "handler_ns": 0,
                                          "handler_buckets": [0] * len(a["handler_buckets"])})
        m["actors"] += 1
        for key in ("messages_in", "messages_out", "mailbox_depth", "handler_count", "handler_ns"):
            m[key] += a[key]
        m["mailbox_max"] = max(m["mailbox_max"], a["mailbox_max"])
        m["handler_buckets"] = [x + y for x, y in zip(m["handler_buckets"], a["handler_buckets"])]
    return meshes


def _shape_meters(instruments: List[Dict[str, Any]]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """{meter: {instrument: {kind, value|count/sum/min/max, series}}}."""
    out: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for i in instruments:
        series = [dict(s, attributes=_parse_attributes(s["attributes"])) for s in i["series"]]
        entry: Dict[str, Any] = {"kind": i["kind"], "description": i["description"], "unit": i["unit"],
                                 "series": series}
        if i["kind"] == "counter":
            entry["value"] = sum(s["sum"] for s in series)
            for s in series:
                for key in ("min", "max", "buckets"):
                    s.pop(key, None)
        else:
            entry["count"] = sum(s["count"] for s in series)
            entry["sum"] = sum(s["sum"] for s in series)
        out.setdefault(i["meter"], {})[i["name"]] = entry
    return out


def _shape(raw: Dict[str, Any]) -> Dict[str, Any]:
    """The binding's dict in the documented form."""
    d = dict(raw)
    d["meshes"] = _aggregate_meshes(d["actors"])
    d["meters"] = _shape_meters(d["meters"])
    return d


def metrics(mesh: Union["ProcMesh", "ActorMesh[Any]"], timeout: float = 5.0) -> "ValueMesh[Dict[str, Any]]":
    """Every proc's metrics snapshot, as a ValueMesh over the proc mesh's
    shape (see the module's doc and docs/observability.md for the keys). A
    proc that does not answer within ``timeout`` seconds has ``"error"`` set.
    Call it in the controller that started the procs."""
    from .errors import ProcError
    from .mesh import ActorMesh, ProcMesh
    from .shape import ValueMesh

    procs = mesh._proc_mesh if isinstance(mesh, ActorMesh) else mesh
    if not isinstance(procs, ProcMesh):
        raise TypeError(f"metrics() takes a ProcMesh or an ActorMesh spawned on one, not {type(mesh).__name__}")
    if procs._impl is None:
        raise ProcError("the metrics of a proc mesh are read in the controller that started it",
                        "FAILED_PRECONDITION")
    if not (timeout > 0):
        raise ValueError("timeout must be a positive number of seconds")
    values = procs._row_major(lambda impl: _castmesh.metrics_collect(impl, float(timeout)), "metrics")
    return ValueMesh(procs.shape, [_shape(v) for v in values])


def this_process() -> Dict[str, Any]:
    """This process's snapshot, in the same form as one of ``metrics()``'s."""
    return _shape(_castmesh.metrics_this_process())


def _otel_meter(name: str) -> Any:
    """OpenTelemetry's meter `name`, or None when opentelemetry-api is not installed."""
    try:
        from opentelemetry import metrics as otel_metrics  # type: ignore[import-not-found]
    except ImportError:
        return None
    return otel_metrics.get_meter(name)


class Counter:
    """A monotonic counter: ``add(amount, attributes)``. Any thread."""

    __slots__ = ("name", "_impl", "_otel")

    def __init__(self, name: str, impl: Any, otel: Any) -> None:
        self.name = name
        self._impl = impl
        self._otel = otel

    def add(self, amount: Union[int, float], attributes: Attributes = None) -> None:
        """Adds ``amount`` (>= 0) to the series of ``attributes``."""
        value = float(amount)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a counter adds a finite amount >= 0, not {amount!r}")
        self._impl.add(value, _attributes_key(attributes))
        if self._otel is not None:
            self._otel.add(amount, attributes=dict(attributes) if attributes else None)


class Histogram:
    """A distribution: ``record(value, attributes)``. Any thread."""

    __slots__ = ("name", "_impl", "_otel")

    def __init__(self, name: str, impl: Any, otel: Any) -> None:
        self.name = name
        self._impl = impl
        self._otel = otel

    def record(self, amount: Union[int, float], attributes: Attributes = None) -> None:
        """Records ``amount`` in the series of ``attributes``."""
        value = float(amount)
        if not math.isfinite(value):
            raise ValueError(f"a histogram records finite values, not {amount!r}")
        self._impl.record(value, _attributes_key(attributes))
        if self._otel is not None:
            self._otel.record(amount, attributes=dict(attributes) if attributes else None)


class Meter:
    """A named group of instruments (``castmesh.get_meter(name)``)."""

    __slots__ = ("name", "_otel")

    def __init__(self, name: str) -> None:
        self.name = name
        self._otel = _otel_meter(name)

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        """The counter ``name`` of this meter (the same series on every call)."""
        impl = _castmesh.meter_counter(self.name, name, description, unit)
        otel = self._otel.create_counter(name, unit=unit, description=description) if self._otel else None
        return Counter(name, impl, otel)

    def create_histogram(self, name: str, unit: str = "", description: str = "") -> Histogram:
        """The histogram ``name`` of this meter."""
        impl = _castmesh.meter_histogram(self.name, name, description, unit)
        otel = self._otel.create_histogram(name, unit=unit, description=description) if self._otel else None
        return Histogram(name, impl, otel)


def get_meter(name: str) -> Meter:
    """The meter ``name`` of this process (monarch.actor's / OpenTelemetry's name)."""
    if not isinstance(name, str) or not name:
        raise ValueError("a meter needs a name")
    return Meter(name)


def observer_target() -> Dict[str, str]:
    """Where ``python -m castmesh top`` connects to observe this controller:
    ``{"address", "secret"}``. The secret is the mesh's (whoever has it can
    also control the mesh): pass it through ``CASTMESH_SECRET``, never on a
    command line others can read."""
    from . import _runtime

    address, secret = _castmesh.observer_target() if _runtime.current() is not None else ("", "")
    if not address:
        raise RuntimeError("this process has not started any proc yet: there is nothing to observe")
    return {"address": address, "secret": secret}


class Observer:
    """A read-only observer connection to a controller or host agent: reads
    metrics (``metrics()``); the target refuses its spawns and actor
    messages (docs/security.md)."""

    def __init__(self, address: str, secret: str, name: str = "castmesh top", timeout: float = 10.0) -> None:
        self._impl = _castmesh.Observer.connect(address, secret, name, float(timeout))

    @property
    def label(self) -> str:
        return str(self._impl.label)

    def metrics(self, timeout: float = 5.0) -> List[Dict[str, Any]]:
        """The target's snapshot and those of every proc it is connected to (the target first)."""
        return [_shape(d) for d in self._impl.metrics(float(timeout))]
