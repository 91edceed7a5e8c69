"""Controller scenarios for tests/python/test_output.py (each its own process,
so the test reads exactly what this controller printed).

    python controller.py SCENARIO
"""

from __future__ import annotations

import logging
import os
import sys

import castmesh
from castmesh import Actor, endpoint

RANKS = 8
LINES = 12_500  # 8 x 12,500 = 100,000 lines


class Writer(Actor):
    @endpoint
    def lines(self, n: int) -> int:
        rank = castmesh.current_rank().rank
        out = sys.stdout
        for i in range(n):
            out.write(f"rank {rank} line {i}\n")
        out.flush()
        return n

    @endpoint
    def same(self) -> None:
        print("the same line everywhere", flush=True)

    @endpoint
    def raw(self) -> None:
        os.write(1, b"written at fd 1 by C-level code\n")
        os.write(2, b"written at fd 2 by C-level code\n")

    @endpoint
    def log(self) -> int:
        seen = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                seen.append(record.rank)  # type: ignore[attr-defined]

        handler = Keep()
        self.logger.addHandler(handler)
        self.logger.warning("a warning of the actor")
        self.logger.removeHandler(handler)
        return seen[0]


def main(scenario: str) -> None:
    procs = castmesh.this_host().spawn_procs({"ranks": RANKS if scenario == "many" else 4})
    if scenario == "many":
        procs.logging_option(stream_to_client=True).get()
        writers = procs.spawn("writer", Writer)
        assert set(writers.lines.call(LINES).get().values()) == {LINES}
    elif scenario == "aggregate":
        procs.logging_option(stream_to_client=True, aggregate_window_sec=1.0).get()
        procs.spawn("writer", Writer).same.call().get()
    elif scenario == "streams":
        procs.logging_option(stream_to_client=True, level=logging.WARNING).get()
        writers = procs.spawn("writer", Writer)
        writers.raw.call().get()
        ranks = writers.log.call().get()
        assert sorted(ranks.values()) == [0, 1, 2, 3], ranks
    procs.stop().get()  # every line written before the stop arrives


if __name__ == "__main__":
    main(sys.argv[1])
