# Warning and sanitizer flags shared by every castmesh target.
add_library(castmesh_compile_options INTERFACE)
target_compile_options(castmesh_compile_options INTERFACE
  $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>
  $<$<AND:$<COMPILE_LANGUAGE:C,CXX>,$<BOOL:${CASTMESH_WERROR}>>:-Werror>
  # clang checks every ABSL_GUARDED_BY (castmesh/detail/mutex.h) at compile
  # time; GCC ignores the annotations.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wthread-safety>)
if(CASTMESH_SANITIZE MATCHES "thread")
  # GCC's -Wtsan says ThreadSanitizer does not model std::atomic_thread_fence;
  # code that uses fences on purpose (the scheduler) stays buildable with
  # -Werror under tsan, and the warning stays visible.
  # The tsan preset builds at -O1 (CI time), where GCC 12's
  # -Wmaybe-uninitialized reports absl::StatusOr's union member falsely;
  # the dev (-O0) and release (-O2) builds keep the warning as an error.
  target_compile_options(castmesh_compile_options INTERFACE
    $<$<COMPILE_LANGUAGE:C,CXX>:-Wno-error=tsan>
    $<$<AND:$<COMPILE_LANGUAGE:C,CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized>)
endif()

if(CASTMESH_SANITIZE)
  # Debug info comes from the build type (the presets ask for line tables,
  # -g1: enough for reports, and much cheaper to compile than -g).
  add_compile_options(-fsanitize=${CASTMESH_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${CASTMESH_SANITIZE})
endif()

# Applies castmesh's warning flags to a target without exporting them.
function(castmesh_target_defaults target)
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:castmesh_compile_options>)
endfunction()

# Keeps the symbols of static archives linked into a shared library (a
# toolchain that links libstdc++ statically, libstdc++_nonshared.a of
# manylinux compilers) out of its exports. Exported, they interpose the
# process's own libstdc++: on a GPU machine whose gcc linked libstdc++ into
# libcastmesh_core.so, `import castmesh; import torch` aborted in torch's
# std::locale teardown ("free(): invalid pointer").
function(castmesh_hide_static_archives target)
  if(NOT APPLE AND NOT WIN32)  # ELF linkers (GNU ld, gold, lld)
    target_link_options(${target} PRIVATE "LINKER:--exclude-libs,ALL")
  endif()
endfunction()
