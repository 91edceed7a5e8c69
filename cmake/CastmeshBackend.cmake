# castmesh_add_backend(<target> SOURCES <files...> [OUTPUT_DIRECTORY <dir>])
#
# A backend plugin: a MODULE library libcastmesh_<name>.so that exports only
# castmesh_backend_init_v1 (version script, hidden visibility), has no
# undefined symbols (-Wl,--no-undefined) and does not link libcastmesh_core:
# it sees only the C ABI header include/castmesh/backend_abi.h. By default it
# lands in <build>/lib/castmesh/backends, next to the core library, where the
# core's discovery finds it.
function(castmesh_add_backend target)
  cmake_parse_arguments(ARG "" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  set(CASTMESH_BACKEND_MAP "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/castmesh_backend.map")
  if(NOT ARG_OUTPUT_DIRECTORY)
    set(ARG_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/lib/castmesh/backends")
  endif()
  add_library(${target} MODULE ${ARG_SOURCES})
  castmesh_target_defaults(${target})
  target_include_directories(${target} PRIVATE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>)
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY "${ARG_OUTPUT_DIRECTORY}"
    LINK_DEPENDS "${CASTMESH_BACKEND_MAP}")
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${CASTMESH_BACKEND_MAP}"
    "LINKER:--no-undefined")
endfunction()
