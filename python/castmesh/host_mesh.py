"""Hosts: this machine (:func:`this_host`) or machines running host agents
(:func:`attach_to_workers`), and the proc meshes started on them
(docs/hosts.md).

Monarch's names: ``attach_to_workers(workers=[...])`` returns a
:class:`HostMesh` with one dimension ``hosts``; ``spawn_procs(per_host=...)``
starts a :class:`ProcMesh` ``{hosts, per_host...}`` whose procs join this
controller directly; ``shutdown()`` stops everything on those hosts and ends
their agents.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import sys
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from . import _castmesh, _context, _runtime
from .errors import ProcError, with_context
from .future import Future, gather, in_thread
from .proc_mesh import ProcMesh, _local_spawn_procs, _mesh_dims
from .shape import MeshShapeOps, Point, Shape

TRUST_ALL_CONNECTIONS = "trust_all_connections"
# The proc meshes this controller started on each agent (by its address),
# whichever HostMesh started them (HostMesh.shutdown stops them all).
_meshes_by_agent: Dict[str, "weakref.WeakSet[Any]"] = {}

# How a proc starts: the extra environment of every proc, or a callable of
# its Point returning it (e.g. a rank-dependent variable).
BootstrapCommand = Union["ProcCommand", Mapping[str, str], Callable[[Point], Union["ProcCommand", Mapping[str, str]]]]


class ProcCommand:
    """How one proc is started: ``env`` is added to its environment (the
    worker program itself is always castmesh's Python worker)."""

    def __init__(self, env: Optional[Mapping[str, str]] = None) -> None:
        self.env: Dict[str, str] = dict(env or {})

    def __repr__(self) -> str:
        return f"ProcCommand(env={self.env!r})"


class HostMesh(MeshShapeOps):
    """Machines procs can be started on: :func:`this_host` (this machine,
    shape ``{}``), or the hosts of :func:`attach_to_workers` (shape
    ``{"hosts": n}``, sliceable like other meshes)."""

    def __init__(self, shape: Shape, pending: Optional[Future[Any]] = None, root: Optional["HostMesh"] = None,
                 ops: tuple = ()) -> None:
        # pending: the attachment (a Future of the C++ HostMesh), None for
        # this_host; root: the mesh as attached (owns shutdown); ops: the
        # selections from the root to this view.
        self._shape = shape
        self._pending = pending
        self._root = root
        self._ops = ops
        self._shutdown: Optional[Future[None]] = None

    @property
    def shape(self) -> Shape:
        """The hosts' shape (``{"hosts": n}`` as attached)."""
        return self._shape

    def __len__(self) -> int:
        return len(self._shape)

    @property
    def initialized(self) -> Future[None]:
        """Resolves (``await`` or ``.get()``) once every agent answered the
        attach; fails naming the agents that did not."""
        if self._pending is None:
            return Future.ready(None)
        return gather([self._pending], lambda values: None)

    def _impl(self) -> Any:
        """The C++ HostMesh of this view (waits for the attach)."""
        assert self._pending is not None
        impl = self._pending.get()
        for kind, name, what in self._ops:
            if kind == "select":
                impl = impl.select_index(name, what) if isinstance(what, int) else impl.select_range(name, *what)
        return impl

    @property
    def hosts(self) -> List[Dict[str, Any]]:
        """Each host's agent address, host name and identity, in row-major order."""
        if self._pending is None:
            return [{"address": "", "agent": "", "hostname": socket.gethostname(), "host_identity": "",
                     "agent_pid": os.getpid()}]
        return list(self._impl().hosts)

    def slice(self, **selectors: Union[int, slice, range]) -> "HostMesh":
        """Some of the hosts (Python's indexing rules), e.g. ``hosts.slice(hosts=slice(0, 2))``."""
        if self._pending is None:
            raise ValueError("this_host() has no dimension to slice")
        resolved = self._shape.resolve(selectors)
        ops = self._ops + tuple(("select", name, sel) for name, sel, _ in resolved)
        return HostMesh(self._shape.apply(resolved), self._pending, self._root or self, ops)

    def _with_shape(self, shape: Shape) -> "HostMesh":
        view = HostMesh(shape, self._pending, self._root or self, self._ops)
        return view

    def spawn_procs(self, per_host: Optional[Mapping[str, int]] = None, bootstrap: Optional[Callable[[], Any]] = None,
                    name: Optional[str] = None, proc_bind: Optional[Union[str, Sequence[Any]]] = None,
                    bootstrap_command: Optional[BootstrapCommand] = None, *, join_timeout: float = 60.0) -> "ProcMesh":
        """Starts the product of ``per_host``'s sizes procs on every host
        (e.g. ``{"gpus": 4}``); the mesh's shape is ``{hosts..., per_host...}``
        (this_host: ``per_host`` alone). Returns once all joined.

        ``bootstrap`` runs in every new proc before actors are spawned (one
        that raises stops the procs and raises here, naming the proc);
        ``bootstrap_command`` gives procs extra environment (a mapping, a
        :class:`ProcCommand`, or a callable of each proc's Point returning
        one); ``proc_bind`` binds CPUs: ``"cores"`` (one core per proc of a
        host) or one entry per proc of a host, each a CPU list (``"0-3"``) or
        a dict with ``"cpus"``. Inside an actor, only this_host() can start
        procs (through the controller)."""
        del name  # accepted for Monarch's signature; procs are named by their rank
        if self._pending is None:
            if bootstrap_command is not None or proc_bind is not None:
                raise ValueError("bootstrap_command and proc_bind apply to hosts of attach_to_workers(), "
                                 "not this_host()")
            mesh = _local_spawn_procs(per_host, join_timeout)
        else:
            if _context.in_worker():
                raise RuntimeError("procs on attached hosts are started by the controller that attached them")
            dims = _mesh_dims(per_host)
            impl = self._impl()
            world = Shape({**self._shape.sizes, **dims}) if set(self._shape.labels).isdisjoint(dims) else None
            if world is None:
                raise ValueError(f"per_host {dims} reuses a dimension of the hosts {self._shape}")
            env_by_rank = _env_by_rank(bootstrap_command, world)
            env = [("CASTMESH_PY_PATH", os.pathsep.join(p for p in sys.path if p))]
            try:
                cmesh = impl.spawn_procs(list(dims.items()), [], True, env, env_by_rank, _proc_bind(proc_bind),
                                         join_timeout)
            except ProcError as error:
                raise with_context(error, f"starting {len(world)} procs on {len(self)} host(s) failed") from None
            mesh = ProcMesh(cmesh, world)
            for host in impl.hosts:
                _meshes_by_agent.setdefault(host["agent"], weakref.WeakSet()).add(mesh)
            # No terminal is shared with other hosts: their output comes here.
            mesh.logging_option(stream_to_client=True).get()
        if bootstrap is not None:
            _run_bootstrap(mesh, bootstrap)
        return mesh

    def shutdown(self) -> Future[None]:
        """Stops every proc mesh started on these hosts, kills what is left
        and ends their agents (the whole attachment, also on a slice).
        Idempotent; the future completes once the agents answered."""
        root = self._root or self
        if root._pending is None:
            raise ValueError("this_host() cannot be shut down")
        if root._shutdown is None:
            pending = root._pending

            def stop_all() -> None:
                # Every proc mesh of this controller on these agents, also those
                # started through another attachment to them: the agents end all
                # of this controller's procs, which must be stopped, not failed.
                agents = [host["agent"] for host in pending.get().hosts]
                meshes = {mesh for agent in agents for mesh in list(_meshes_by_agent.get(agent, ()))}
                for mesh in meshes:
                    try:
                        mesh.stop().get()
                    except Exception:  # noqa: BLE001 - the agents end what is left
                        pass
                pending.get().shutdown()

            root._shutdown = in_thread(stop_all, "castmesh-host-shutdown")
        return root._shutdown

    def __repr__(self) -> str:
        return "<HostMesh this_host>" if self._pending is None else f"<HostMesh {self._shape}>"


_this_host: Optional[HostMesh] = None


def this_host() -> HostMesh:
    """The host running the caller."""
    global _this_host
    if _this_host is None:
        _this_host = HostMesh(Shape({}))
    return _this_host


def _env_by_rank(command: Optional[BootstrapCommand], world: Shape) -> List[List[tuple]]:
    """The extra environment of each proc of `world`, by rank ([] when none)."""
    if command is None:
        return []
    out: List[List[tuple]] = []
    for point in world.points():
        spec = command(point) if callable(command) else command
        env = spec.env if isinstance(spec, ProcCommand) else spec
        if not isinstance(env, Mapping):
            raise TypeError(f"bootstrap_command must give a mapping of environment variables or a ProcCommand, "
                            f"got {type(spec).__name__}")
        out.append([(str(k), str(v)) for k, v in env.items()])
    return out


def _proc_bind(spec: Optional[Union[str, Sequence[Any]]]) -> str:
    """proc_bind as the agents take it: "", "cores" or CPU lists joined by ';'."""
    if spec is None:
        return ""
    if isinstance(spec, str):
        return spec
    lists = []
    for entry in spec:
        if isinstance(entry, Mapping):
            cpus = entry.get("cpus", entry.get("physcpubind"))
            if cpus is None:
                raise ValueError(f"proc_bind entry {entry!r} has no 'cpus'")
            lists.append(str(cpus))
        else:
            lists.append(str(entry))
    return ";".join(lists)


def _run_bootstrap(mesh: Any, bootstrap: Callable[[], Any]) -> None:
    try:
        mesh._run_in_every_proc(bootstrap, "bootstrap")
    except ProcError:
        mesh.stop().get()
        raise


def run_worker_loop_forever(*, address: str, ca: str = TRUST_ALL_CONNECTIONS, private_key: Optional[str] = None,
                            secret: Optional[str] = None, cert: Optional[str] = None,
                            host_identity: Optional[str] = None) -> None:
    """Serves as this machine's host agent at ``address`` (``tcp://HOST:PORT``;
    ``tcp://0.0.0.0:PORT`` listens on every interface, port 0 picks a free
    port). Prints ``castmesh host agent listening at ADDRESS`` once it
    listens. Returns when a controller calls ``HostMesh.shutdown()``;
    raises :class:`castmesh.ProcError` when it cannot listen or has no
    secret. ``ca``, ``cert`` and ``private_key`` (PEM files; the key mode
    0600) turn on mutual TLS 1.3 for the agent and the procs it starts
    (docs/security.md); the default ``ca="trust_all_connections"`` is
    plaintext authenticated by the mesh secret."""
    agent = _castmesh.HostAgent(address, secret or "", host_identity or "",
                                [sys.executable, "-m", "castmesh._worker"], ca, cert or "", private_key or "")
    print(f"castmesh host agent listening at {agent.address}", flush=True)
    while not agent.wait(0.5):
        pass


def _local_address_towards(host: str) -> str:
    """The local address of the route to `host` (a UDP connect sends nothing)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return str(probe.getsockname()[0])


def _dial_host(address: str) -> str:
    """The host part of an agent address (``tcp://HOST:PORT``, ``tcp:HOST:PORT``)."""
    match = re.fullmatch(r"tcp:(?://)?(?:[^@/]+@)?(\[[^\]]+\]|[^:/@\[\]]+):\d+", address)
    if match is None:
        raise ValueError(f"host agent address {address!r}: expected tcp://HOST:PORT or tcp:HOST:PORT")
    return match.group(1).strip("[]")


def _controller_runtime(first_worker: str, secret: Optional[str], tls: Sequence[str]) -> None:
    """Makes this process's runtime listen on TCP where the agents reach it,
    with mutual TLS when ``tls`` is (ca, cert, key) (unless it already is a
    proc: the attach then checks its address and TLS)."""
    if _runtime.current() is not None:
        return
    resolved = _castmesh.resolve_mesh_secret(secret or "")
    host = _dial_host(first_worker)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        _runtime.runtime(listen="tcp:127.0.0.1:0", secret=resolved, tls=tuple(tls))
        return
    try:
        local = _local_address_towards(host)
    except OSError as error:
        raise ProcError(f"cannot reach host agent {first_worker}: {error}", "UNAVAILABLE") from None
    _runtime.runtime(listen="tcp:0.0.0.0:0", secret=resolved, advertise_host=local, tls=tuple(tls))


def attach_to_workers(*, workers: Sequence[Union[str, Future[str]]], ca: str = TRUST_ALL_CONNECTIONS,
                      private_key: Optional[str] = None, name: Optional[str] = None, secret: Optional[str] = None,
                      cert: Optional[str] = None, heartbeat_interval: float = 0.5, heartbeat_timeout: float = 5.0,
                      attach_timeout: float = 30.0) -> HostMesh:
    """Attaches this controller to the host agents at ``workers`` (each
    ``"tcp://HOST:PORT"``, or a Future of one) and returns their
    :class:`HostMesh` at once; :attr:`HostMesh.initialized` resolves when
    every agent answered. ``secret`` (else ``CASTMESH_SECRET`` or the 0600
    file ``CASTMESH_SECRET_FILE``) must be the agents'. A host that vanishes
    without a reset fails pending calls within ``heartbeat_timeout +
    heartbeat_interval`` seconds. ``ca``, ``cert`` and ``private_key``
    must match the agents' TLS (both with or both without): this
    controller's own listener uses them too."""
    if _context.in_worker():
        raise RuntimeError("attach_to_workers is called by the controller, not in a worker proc")
    workers = list(workers)
    if not workers:
        raise ValueError("attach_to_workers needs at least one worker address")
    if not heartbeat_timeout > heartbeat_interval > 0:
        raise ValueError("heartbeat_timeout must be longer than heartbeat_interval, both positive")
    # Before this process's listener is made with them (the C++ attach
    # checks them again, files included).
    if ca == TRUST_ALL_CONNECTIONS and (cert or private_key):
        raise ValueError(f"cert/private_key were given with ca={TRUST_ALL_CONNECTIONS!r}: mutual TLS needs the CA "
                         "file that signs every host's certificate as ca")
    if ca != TRUST_ALL_CONNECTIONS and not (cert and private_key):
        raise ValueError(f"ca={ca!r} turns on mutual TLS, which also needs this controller's certificate (cert=) "
                         "and private key (private_key=) files, signed by that CA")

    def attach() -> Any:
        addresses = [w.get() if isinstance(w, Future) else str(w) for w in workers]
        # Checked (and made absolute) by the C++ attach; the listener made
        # first must already use them, since the agents' procs dial it.
        tls = () if ca == TRUST_ALL_CONNECTIONS else (ca, cert or "", private_key or "")
        _controller_runtime(addresses[0], secret, tls)
        try:
            return _castmesh.HostMesh.attach(addresses, name or "", secret or "", ca, cert or "", private_key or "",
                                             heartbeat_interval, heartbeat_timeout, attach_timeout)
        except ProcError as error:
            raise with_context(error, "attach_to_workers failed") from None

    return HostMesh(Shape({"hosts": len(workers)}), in_thread(attach, "castmesh-attach"))
