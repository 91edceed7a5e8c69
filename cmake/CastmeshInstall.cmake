# Install rules and the find_package(castmesh) config live here (issue 2).
