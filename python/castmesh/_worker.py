"""Entry point of a castmesh Python worker proc: ``python -m castmesh._worker``.

The controller's LocalAllocator starts this with the bootstrap environment
(``CASTMESH_BOOTSTRAP``), or a launcher (srun, mpirun, mpiexec, a Kubernetes
indexed Job) starts it with ``CASTMESH_RENDEZVOUS`` and ``CASTMESH_SECRET``,
the rank coming from the launcher's own variables (docs/procs.md, "Running
on a cluster"). The process then serves as a castmesh proc (hosting Python
actors) until the controller stops it, disconnects or dies. A worker that
cannot join exits with status 1, a bad environment (e.g. a rank that is not
a number) with status 2, the reason on stderr.
"""

from __future__ import annotations

import os
import sys


def _secret_to_descriptor() -> None:
    """Moves the mesh secret out of the environment before any user code runs.

    A launcher (srun, mpirun, ...) puts it in ``CASTMESH_SECRET``; a
    LocalAllocator passes it through an inherited pipe instead
    (``CASTMESH_SECRET_FD``). Python keeps its own copy of the environment in
    ``os.environ``, which actors (and their children, e.g. ``subprocess`` with
    ``env=os.environ.copy()``) would see: the secret leaves it here, and goes to
    the C++ worker through a pipe of this process. Its value is blanked in place
    first, while the process environment still points at it: then also in the
    block the process was started with (what ``ps`` and ``/proc/<pid>/environ``
    show), on systems without Linux's /proc/self/stat to find that block by.
    """
    secret = os.environb.get(b"CASTMESH_SECRET")
    if secret is not None:
        from castmesh import _castmesh  # loaded already (by the package)

        # Before any unsetenv: after one, nothing points at the value any more.
        _castmesh.erase_from_environment("CASTMESH_SECRET")
        del os.environb[b"CASTMESH_SECRET"]  # Python's copy (its unsetenv finds nothing left)
    if not secret:
        return
    read_end, write_end = os.pipe()  # not inheritable: only this process reads it
    os.write(write_end, secret)  # far smaller than a pipe's buffer
    os.close(write_end)
    os.environ["CASTMESH_SECRET_FD"] = str(read_end)


def main() -> None:
    _secret_to_descriptor()
    os.environ["CASTMESH_PY_WORKER"] = "1"
    # Output of actors reaches the terminal promptly (the proc exits without
    # Python's own shutdown).
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
        except (AttributeError, ValueError):
            pass
    extra = os.environ.get("CASTMESH_PY_PATH")
    if extra:
        for entry in reversed(extra.split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
    from castmesh import _castmesh

    if not os.environ.get("CASTMESH_BOOTSTRAP") and not os.environ.get("CASTMESH_RENDEZVOUS"):
        sys.exit("castmesh._worker is started by castmesh (this_host().spawn_procs) or by a launcher with "
                 "CASTMESH_RENDEZVOUS and CASTMESH_SECRET set (docs/procs.md, 'Running on a cluster')")
    _castmesh.run_worker(sys.argv)


if __name__ == "__main__":
    main()
