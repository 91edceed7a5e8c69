# Cross-compiling for 64-bit Arm Linux with Debian's crossbuild-essential-arm64
# and arm64 libraries installed through multiarch (dpkg --add-architecture
# arm64; apt-get install libabsl-dev:arm64 ...). Test programs run under
# qemu-aarch64 (Debian qemu-user).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Build-machine programs (protoc) come from the host; libraries and packages
# from the arm64 multiarch folders (/usr/lib/aarch64-linux-gnu).
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# pkg-config (used by FindOpenSSL) must read the arm64 .pc files, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
find_program(CASTMESH_QEMU_AARCH64 qemu-aarch64 REQUIRED)
# The arm64 loader and libraries are installed at their multiarch paths, so
# qemu needs no -L prefix.
set(CMAKE_CROSSCOMPILING_EMULATOR "${CASTMESH_QEMU_AARCH64}")
