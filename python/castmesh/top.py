"""``python -m castmesh top <controller address>``: a live table of a mesh's
metrics (docs/observability.md, "castmesh top").

It connects to the controller (or a host agent) as a read-only observer,
proving the mesh secret from ``CASTMESH_SECRET`` (or ``--secret-file``), and
redraws every ``--interval`` seconds with plain ANSI escapes; ``--once``
prints one table and exits. The controller's address and secret come from
``castmesh.observer_target()`` in the controller.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["main", "render"]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _rate(now: float, before: Optional[float], seconds: Optional[float]) -> str:
    if before is None or not seconds:
        return ""
    return f" ({(now - before) / seconds:.0f}/s)"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int = 2) -> List[str]:
    """Columns padded to their widest cell: the first `text_columns` to the left, numbers to the right."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) if i < text_columns else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def render(procs: List[Dict[str, Any]], previous: Optional[List[Dict[str, Any]]] = None,
           seconds: Optional[float] = None, title: str = "") -> str:
    """The table for one snapshot of every proc (``Observer.metrics()``);
    with the previous snapshot and the seconds between, message rates too."""
    before = {p.get("proc_id"): p for p in previous or []}
    out: List[str] = []
    if title:
        out.append(title)
    rows = []
    for p in procs:
        label = p.get("label") or p.get("proc_id", "?")
        if p.get("error"):
            rows.append([label, p.get("proc_id", ""), "-", "-", "-", "-", "error: " + p["error"]])
            continue
        msgs_in = sum(t["messages_in"] for t in p["transports"].values())
        msgs_out = sum(t["messages_out"] for t in p["transports"].values())
        old = before.get(p.get("proc_id"))
        old_in = sum(t["messages_in"] for t in old["transports"].values()) if old and not old.get("error") else None
        bytes_in = sum(t["bytes_in"] for t in p["transports"].values())
        bytes_out = sum(t["bytes_out"] for t in p["transports"].values())
        paths = ", ".join(f"{name} {_size(f['bytes_out'] + f['bytes_in'])}" for name, f in sorted(p["paths"].items()))
        rows.append([label, p.get("proc_id", ""), f"{msgs_in}{_rate(msgs_in, old_in, seconds)}", str(msgs_out),
                     _size(bytes_in), _size(bytes_out), paths or "-"])
    out.append("procs")
    out += _table(["proc", "address", "msgs in", "msgs out", "bytes in", "bytes out", "data-plane paths"], rows)
    mesh_rows = []
    for p in procs:
        if p.get("error"):
            continue
        label = p.get("label") or p.get("proc_id", "?")
        for name, m in sorted(p["meshes"].items()):
            mean_us = m["handler_ns"] / m["handler_count"] / 1000 if m["handler_count"] else 0.0
            mesh_rows.append([name, label, str(m["actors"]), str(m["messages_in"]), str(m["messages_out"]),
                              f"{m['mailbox_depth']}/{m['mailbox_max']}", str(m["handler_count"]),
                              f"{mean_us:.1f}"])
    out.append("")
    out.append("actor meshes")
    out += _table(["mesh", "proc", "actors", "msgs in", "msgs out", "mailbox now/max", "handled", "mean us"],
                  mesh_rows)
    coll_rows = []
    for p in procs:
        if p.get("error"):
            continue
        label = p.get("label") or p.get("proc_id", "?")
        for c in p["communicators"]:
            for kind, k in sorted(c["collectives"].items()):
                coll_rows.append([c["description"], label, f"{c['rank']}/{c['size']}", kind, str(k["calls"]),
                                  _size(k["bytes"])])
    if coll_rows:
        out.append("")
        out.append("collectives")
        out += _table(["communicator", "proc", "rank", "kind", "calls", "bytes"], coll_rows, text_columns=4)
    meter_rows = []
    for p in procs:
        if p.get("error"):
            continue
        label = p.get("label") or p.get("proc_id", "?")
        for meter, instruments in sorted(p["meters"].items()):
            for name, i in sorted(instruments.items()):
                value = f"{i['value']:g}" if i["kind"] == "counter" else \
                    f"n={i['count']} mean={i['sum'] / i['count'] if i['count'] else 0:g}"
                meter_rows.append([f"{meter}.{name}", label, i["kind"], value])
    if meter_rows:
        out.append("")
        out.append("user meters")
        out += _table(["instrument", "proc", "kind", "value"], meter_rows, text_columns=4)
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m castmesh top",
                                     description="A live table of a mesh's metrics, read as a read-only observer.")
    parser.add_argument("address", help="the controller's (or a host agent's) address: castmesh.observer_target()")
    parser.add_argument("--secret-file", help="a file holding the mesh secret (default: $CASTMESH_SECRET)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds each proc gets to answer (default 5)")
    parser.add_argument("--once", action="store_true", help="print one table and exit")
    args = parser.parse_args(argv)
    if args.secret_file:
        with open(args.secret_file, encoding="utf-8") as f:
            secret = f.read().strip()
    else:
        secret = os.environ.get("CASTMESH_SECRET", "")
    if not secret:
        parser.error("the mesh secret is needed: set CASTMESH_SECRET or pass --secret-file")
    if not args.interval > 0:
        parser.error("--interval must be positive")

    from .errors import CastmeshError
    from .meters import Observer

    try:
        observer = Observer(args.address, secret, name="castmesh top", timeout=args.timeout)
    except CastmeshError as error:
        print(f"castmesh top: {error}", file=sys.stderr)
        return 1
    previous: Optional[List[Dict[str, Any]]] = None
    last = 0.0
    try:
        while True:
            try:
                procs = observer.metrics(timeout=args.timeout)
            except CastmeshError as error:
                print(f"castmesh top: {error}", file=sys.stderr)
                return 1
            now = time.monotonic()
            title = f"castmesh top: {observer.label} ({len(procs)} procs) {time.strftime('%H:%M:%S')}"
            text = render(procs, previous, now - last if previous else None, title)
            if args.once:
                sys.stdout.write(text)
                return 0
            sys.stdout.write("\x1b[H\x1b[2J" + text)  # home, clear screen
            sys.stdout.flush()
            previous, last = procs, now
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
