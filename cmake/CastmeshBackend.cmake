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
  # ABI tables grow by appended fields, which C zero-initialises: a backend
  # written before a field existed must keep compiling under -Werror.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-Wno-missing-field-initializers>)
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

# castmesh_install_backend(<target> <component>)
#
# Installs a backend into CASTMESH_BACKEND_INSTALL_DIR with its imported
# target castmesh::<component> in castmesh-<component>-targets.cmake. A
# plugin-only build (CASTMESH_BUILD_CORE=OFF, as for the plugin wheels) also
# installs castmesh_<component>Config.cmake, which castmeshConfig.cmake finds.
function(castmesh_install_backend target component)
  install(TARGETS ${target} EXPORT castmesh-${component}-targets
    LIBRARY DESTINATION "${CASTMESH_BACKEND_INSTALL_DIR}" COMPONENT ${component})
  install(EXPORT castmesh-${component}-targets NAMESPACE castmesh:: FILE castmesh-${component}-targets.cmake
    DESTINATION "${CASTMESH_CMAKE_INSTALL_DIR}" COMPONENT ${component})
  if(NOT CASTMESH_BUILD_CORE)
    include(CMakePackageConfigHelpers)
    set(CASTMESH_COMPONENT ${component})
    configure_package_config_file("${CMAKE_CURRENT_FUNCTION_LIST_DIR}/castmeshComponentConfig.cmake.in"
      "${PROJECT_BINARY_DIR}/castmesh_${component}Config.cmake"
      INSTALL_DESTINATION "${CASTMESH_CMAKE_INSTALL_DIR}")
    write_basic_package_version_file("${PROJECT_BINARY_DIR}/castmesh_${component}ConfigVersion.cmake"
      VERSION ${PROJECT_VERSION} COMPATIBILITY ExactVersion)
    install(FILES "${PROJECT_BINARY_DIR}/castmesh_${component}Config.cmake"
                  "${PROJECT_BINARY_DIR}/castmesh_${component}ConfigVersion.cmake"
      DESTINATION "${CASTMESH_CMAKE_INSTALL_DIR}" COMPONENT ${component})
  endif()
endfunction()
