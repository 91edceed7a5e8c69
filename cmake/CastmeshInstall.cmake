# Install rules for the core and the find_package(castmesh) config package.
#
# Layout (relative to the prefix, so the tree is relocatable):
#   lib/libcastmesh_core.so*                      the core
#   lib/castmesh/backends/libcastmesh_<name>.so   backends (found next to the core)
#   include/castmesh/*.h                          public headers
#   lib/cmake/castmesh/                           castmeshConfig.cmake, one targets file per component
# Components: core, rdma, tensor_engine (each also an install COMPONENT).
include(CMakePackageConfigHelpers)

if(SKBUILD)
  # A wheel cannot hold symlinks (each would be a full copy): ship one file,
  # named after the SONAME (libcastmesh_core.so.MAJOR.MINOR).
  set_property(TARGET castmesh_core PROPERTY VERSION)
  install(TARGETS castmesh_core EXPORT castmesh-core-targets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT core NAMELINK_SKIP
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
else()
  install(TARGETS castmesh_core EXPORT castmesh-core-targets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT core NAMELINK_COMPONENT core
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/castmesh" "${PROJECT_BINARY_DIR}/include/castmesh"
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT core
  FILES_MATCHING PATTERN "*.h")
install(EXPORT castmesh-core-targets NAMESPACE castmesh:: FILE castmesh-core-targets.cmake
  DESTINATION "${CASTMESH_CMAKE_INSTALL_DIR}" COMPONENT core)

configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/castmeshConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/castmeshConfig.cmake"
  INSTALL_DESTINATION "${CASTMESH_CMAKE_INSTALL_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/castmeshConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/castmeshConfig.cmake" "${PROJECT_BINARY_DIR}/castmeshConfigVersion.cmake"
  DESTINATION "${CASTMESH_CMAKE_INSTALL_DIR}" COMPONENT core)
