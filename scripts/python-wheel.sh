# The Python side of castmesh's scripts, sourced (not run) by scripts/test.sh
# (what CI runs) and scripts/run-example.sh (the quick start): one way to make
# the tools venv, build a wheel and install built wheels into a fresh venv.
# Needs the Debian packages of scripts/install-deps.sh (python3-venv, cmake).

# The tools venv at $1 (made when missing): wheel building (scikit-build-core,
# pybind11, build), plus the PyPI packages named after it.
castmesh_tools_venv() {
  local venv=$1; shift
  [ -x "${venv}/bin/python" ] || python3 -m venv "${venv}"
  "${venv}/bin/pip" install -q --disable-pip-version-check scikit-build-core pybind11 build "$@"
}

# Builds the wheel of the project in folder $3 with the tools venv's python $1
# into folder $2; the rest are extra arguments of python -m build (e.g.
# -Cbuild-dir=... to keep the CMake tree for the next run).
castmesh_build_wheel() {
  local py=$1 outdir=$2 project=$3; shift 3
  "${py}" -m build --wheel --outdir "${outdir}" "$@" "${project}"
}

# A fresh venv at $2 (made by the tools venv's python $1) with the packages
# named after $3 installed from the wheels in folder $3; only castmesh's own
# PyPI dependency comes from the package index.
castmesh_wheel_venv() {
  local py=$1 venv=$2 wheels=$3; shift 3
  rm -rf "${venv}"
  "${py}" -m venv "${venv}"
  "${venv}/bin/python" -m pip install -q --disable-pip-version-check cloudpickle
  "${venv}/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "${wheels}" "$@"
}
