# Standalone Asio (Debian libasio-dev) ships headers only and no CMake config.
# Provides the imported target asio::asio.
find_path(ASIO_INCLUDE_DIR NAMES asio.hpp)
if(ASIO_INCLUDE_DIR AND EXISTS "${ASIO_INCLUDE_DIR}/asio/version.hpp")
  file(STRINGS "${ASIO_INCLUDE_DIR}/asio/version.hpp" _asio_ver REGEX "^#define ASIO_VERSION [0-9]+")
  string(REGEX REPLACE "^#define ASIO_VERSION ([0-9]+).*" "\\1" _asio_num "${_asio_ver}")
  math(EXPR _maj "${_asio_num} / 100000")
  math(EXPR _min "${_asio_num} / 100 % 1000")
  math(EXPR _pat "${_asio_num} % 100")
  set(asio_VERSION "${_maj}.${_min}.${_pat}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(asio
  REQUIRED_VARS ASIO_INCLUDE_DIR
  VERSION_VAR asio_VERSION
  FAIL_MESSAGE "standalone Asio not found: on Debian/Ubuntu run 'apt-get install libasio-dev'")
if(asio_FOUND AND NOT TARGET asio::asio)
  find_package(Threads REQUIRED)
  add_library(asio::asio INTERFACE IMPORTED)
  set_target_properties(asio::asio PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${ASIO_INCLUDE_DIR}")
  target_compile_definitions(asio::asio INTERFACE ASIO_STANDALONE ASIO_NO_DEPRECATED)
  target_link_libraries(asio::asio INTERFACE Threads::Threads)
endif()
mark_as_advanced(ASIO_INCLUDE_DIR)
