# cmake -DNM=<nm> -DLIBRARY=<backend.so> -P check_exports.cmake
# Fails unless castmesh_backend_init_v1 is the only defined dynamic symbol.
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY}
  OUTPUT_VARIABLE _out RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${LIBRARY}")
endif()
string(REGEX MATCHALL "[^\n]+" _lines "${_out}")
set(_symbols "")
foreach(_line IN LISTS _lines)
  string(REGEX REPLACE "^[0-9a-fA-F]* *[A-Za-z] +" "" _sym "${_line}")
  # Version nodes (e.g. "VERS_1.0" as absolute 'A' symbols) are not exports.
  if(NOT _line MATCHES " A ")
    list(APPEND _symbols "${_sym}")
  endif()
endforeach()
if(NOT _symbols STREQUAL "castmesh_backend_init_v1")
  message(FATAL_ERROR "${LIBRARY} exports [${_symbols}], expected only castmesh_backend_init_v1")
endif()
message(STATUS "${LIBRARY}: exports only castmesh_backend_init_v1")
