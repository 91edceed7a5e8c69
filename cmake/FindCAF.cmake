# C++ Actor Framework (Debian libcaf-dev, CAF 0.17) ships no CMake config.
# Used only by the optional comparison benchmarks (CASTMESH_BENCH_CAF=ON).
# Provides the imported target CAF::core.
find_path(CAF_INCLUDE_DIR NAMES caf/all.hpp)
find_library(CAF_CORE_LIBRARY NAMES caf_core)
if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _caf_ver REGEX "^#define CAF_VERSION [0-9]+")
  string(REGEX REPLACE "^#define CAF_VERSION ([0-9]+).*" "\\1" _caf_num "${_caf_ver}")
  math(EXPR _maj "${_caf_num} / 10000")
  math(EXPR _min "${_caf_num} / 100 % 100")
  math(EXPR _pat "${_caf_num} % 100")
  set(CAF_VERSION "${_maj}.${_min}.${_pat}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_CORE_LIBRARY CAF_INCLUDE_DIR
  VERSION_VAR CAF_VERSION
  FAIL_MESSAGE "CAF (libcaf_core) not found: on Debian/Ubuntu run 'apt-get install libcaf-dev', or configure with -DCASTMESH_BENCH_CAF=OFF")
if(CAF_FOUND AND NOT TARGET CAF::core)
  find_package(Threads REQUIRED)
  add_library(CAF::core UNKNOWN IMPORTED)
  set_target_properties(CAF::core PROPERTIES
    IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}")
  target_link_libraries(CAF::core INTERFACE Threads::Threads)
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY)
