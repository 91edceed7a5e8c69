"""Checks an installed castmesh (from wheels) in the current environment.

    python check_backends.py rdma=found tensor_engine=missing --only castmesh castmesh-rdma

name=found: a library for the backend was found (loaded, or no device / no
driver on this machine); name=missing: reported as "library missing" with a
pip hint. --only: the distributions the environment may hold (besides pip and
setuptools), to prove that installing castmesh pulled nothing else (no CUDA,
no torch, no ibverbs wheels).
"""

import argparse
import sys
from importlib import metadata

import castmesh

ALWAYS_PRESENT = {"pip", "setuptools", "wheel"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("expectations", nargs="*", help="name=found|missing")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()

    failures = []
    print(f"castmesh {castmesh.__version__} from {castmesh.__file__}")
    if castmesh.__version__ != metadata.version("castmesh"):
        failures.append(f"castmesh.__version__ {castmesh.__version__} != dist {metadata.version('castmesh')}")

    found = {info.name: info for info in castmesh.backends()}
    for info in found.values():
        print(f"  {info.name:14} {info.state:16} {info.path or '-'}")
        if info.message:
            print(f"      why: {info.message}")
    for expectation in args.expectations:
        name, want = expectation.split("=")
        info = found.get(name)
        if info is None:
            failures.append(f"{name} not listed")
        elif want == "found" and not info.found:
            failures.append(f"{name} expected found, is {info.state}: {info.message}")
        elif want == "missing" and (info.found or "pip install" not in info.message):
            failures.append(f"{name} expected missing with a pip hint, is {info.state}: {info.message}")

    if args.only is not None:
        installed = {dist.metadata["Name"].lower().replace("_", "-") for dist in metadata.distributions()}
        allowed = {name.lower() for name in args.only} | ALWAYS_PRESENT
        extra = sorted(installed - allowed)
        print(f"  installed distributions: {sorted(installed)}")
        if extra:
            failures.append(f"unexpected distributions installed: {extra}")

    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    print("wheel check: " + ("FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
