"""The host agent of one machine: ``castmesh.run_worker_loop_forever`` (as
Monarch's), ``python -m castmesh.host --address tcp://0.0.0.0:26600`` and
the ``castmesh-host`` command run the same agent (docs/hosts.md).

It listens at ``address``, serves one controller at a time
(:func:`castmesh.attach_to_workers`), starts castmesh Python worker procs
for it with this interpreter, and kills them all when that controller
disconnects or stops answering heartbeats. Every connection must prove the
mesh secret: ``secret=``, else ``CASTMESH_SECRET``, else the file named by
``CASTMESH_SECRET_FILE`` (mode 0600).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .errors import ProcError
from .host_mesh import TRUST_ALL_CONNECTIONS, run_worker_loop_forever


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m castmesh.host`` / ``castmesh-host``."""
    parser = argparse.ArgumentParser(prog="castmesh-host", description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", required=True, help="tcp://HOST:PORT to listen at (port 0: a free one)")
    parser.add_argument("--host-identity", default=None, help="this host's identity for same-host data paths")
    parser.add_argument("--ca", default=TRUST_ALL_CONNECTIONS, help="mutual TLS: the CA certificate file")
    parser.add_argument("--cert", default=None, help="mutual TLS: this host's certificate file")
    parser.add_argument("--key", default=None, help="mutual TLS: this host's private key file (mode 0600)")
    args = parser.parse_args(argv)
    try:
        run_worker_loop_forever(address=args.address, ca=args.ca, private_key=args.key, cert=args.cert,
                                host_identity=args.host_identity)
    except (ProcError, NotImplementedError) as error:
        sys.exit(f"castmesh-host: {error}")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
