#!/usr/bin/env bash
# Builds the docs site into build/docs and runs every Python block of the docs.
#
#   bash scripts/docs.sh              # site (mkdocs build --strict) + code blocks
#   bash scripts/docs.sh --site-only  # the site alone (no castmesh build needed)
#   bash scripts/docs.sh --serve      # live preview at http://127.0.0.1:8000
#
# Needs Debian's python3 (with python3-venv) and PyPI: the pinned tools of docs/requirements.txt go into the venv
# build/venv-docs (reinstalled only when that file changes; wheels cached in build/pip-cache). The code blocks
# (tests/docs/test_code_blocks.py) run against the dev build's package, build/dev/python, with the interpreter
# that build was configured with: build it first (README's test command does; or cmake --preset dev
# -DCASTMESH_BUILD_PYTHON=ON ... && cmake --build --preset dev --target castmesh_python). Warnings are errors.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build/venv-docs
REQUIREMENTS=docs/requirements.txt
DEV_PYTHON=build/dev/python
mode=${1:-all}
case "${mode}" in all|--site-only|--serve) ;; *) echo "usage: bash scripts/docs.sh [--site-only|--serve]" >&2; exit 2;; esac

# The tools venv, reinstalled only when the pinned list changed.
stamp=${VENV}/requirements.txt
if ! cmp -s "${REQUIREMENTS}" "${stamp}" 2> /dev/null || [ ! -x "${VENV}/bin/mkdocs" ]; then
  rm -rf "${VENV}"
  python3 -m venv "${VENV}"
  # Every package is pinned in the file, so no resolving (--no-deps); no byte-compiling of ~35 packages either.
  "${VENV}/bin/python" -m pip install -q --disable-pip-version-check --cache-dir build/pip-cache --no-deps --no-compile \
    -r "${REQUIREMENTS}"
  cp "${REQUIREMENTS}" "${stamp}"
fi
export NO_MKDOCS_2_WARNING=1  # mkdocs-material's notice about its successor, printed on every build

if [ "${mode}" = --serve ]; then exec "${VENV}/bin/mkdocs" serve; fi
start=${SECONDS}
"${VENV}/bin/mkdocs" build --strict
echo "docs: site built into build/docs in $((SECONDS - start))s"
[ "${mode}" = --site-only ] && exit 0

# The code blocks, with the interpreter the dev build's extension was built for.
python=$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' build/dev/CMakeCache.txt 2> /dev/null || true)
if [ ! -d "${DEV_PYTHON}/castmesh" ] || [ -z "${python}" ]; then
  echo "docs: no dev build with Python (${DEV_PYTHON}): build it to run the code blocks (see the top of $0)," \
       "or pass --site-only" >&2
  exit 1
fi
start=${SECONDS}
PYTHONPATH=${PWD}/${DEV_PYTHON} PYTHONDONTWRITEBYTECODE=1 \
  "${python}" -m pytest -q -rs -p no:cacheprovider tests/docs/test_code_blocks.py
echo "docs: code blocks ran in $((SECONDS - start))s"
