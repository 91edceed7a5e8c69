"""``python -m castmesh <command>``: the package's command-line tools.

* ``top <controller address>``: a live table of a mesh's metrics
  (castmesh.top; docs/observability.md).
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

COMMANDS = {"top": "a live table of a mesh's metrics, as a read-only observer"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        usage = "usage: python -m castmesh <command> [args]\ncommands:\n" + \
            "".join(f"  {name}  {what}\n" for name, what in COMMANDS.items())
        if args and args[0] not in ("-h", "--help"):
            sys.stderr.write(f"python -m castmesh: unknown command {args[0]!r}\n{usage}")
            return 2
        sys.stdout.write(usage)
        return 0
    from . import top

    return top.main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
