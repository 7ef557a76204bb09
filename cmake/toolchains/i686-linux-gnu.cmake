# Cross build for i686 (x86, 32-bit: 4-byte size_t and pointers, 32-bit long;
# binary32 and binary64 arithmetic on SSE2, CMakeLists.txt) with Debian's
# cross compiler (FKVF_CROSS_ARCHES=i386 scripts/install-cross-deps.sh).
# Not part of scripts/test-cross.sh: under Debian 12's qemu-i386 (7.2) a
# dynamically linked program's fork() never returns in the child, and the
# Check suites fork every test; armhf is the 32-bit target that runs. The
# build itself is warning-free (it was when issue 20 added this file), and
# the CLI's archives were byte-identical to x86-64's.
#   cmake -S . -B build-cross-i386 --toolchain cmake/toolchains/i686-linux-gnu.cmake
# The target's own libraries (zlib, xxHash, Check, libarchive, libcurl) come
# from the sysroot that script unpacks: build-deps/cross/sysroot-i386, or
# $FKVF_CROSS_DIR/sysroot-i386.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR i686)
set(CMAKE_C_COMPILER i686-linux-gnu-gcc)
include(${CMAKE_CURRENT_LIST_DIR}/cross-common.cmake)
fkvf_cross_setup(i686-linux-gnu i386-linux-gnu i386 qemu-i386)
