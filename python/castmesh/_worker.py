"""Entry point of a castmesh Python worker proc: ``python -m castmesh._worker``.

The controller's LocalAllocator starts this with the bootstrap environment;
the process then serves as a castmesh proc (hosting Python actors) until the
controller stops it, disconnects or dies.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
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

    if not os.environ.get("CASTMESH_BOOTSTRAP"):
        sys.exit("castmesh._worker is started by castmesh (this_host().spawn_procs), not by hand")
    _castmesh.run_worker(sys.argv)


if __name__ == "__main__":
    main()
