# Cross build for i686 (x86, 32-bit: 4-byte size_t and pointers, 32-bit long) with Debian's
# cross compiler, run under qemu user-mode emulation (scripts/test-cross.sh,
# which installs both through scripts/install-cross-deps.sh):
#   cmake -S . -B build-cross-i386 --toolchain cmake/toolchains/i686-linux-gnu.cmake
# The target's own libraries (zlib, xxHash, Check, libarchive, libcurl) come
# from the sysroot that script unpacks: build-deps/cross/sysroot-i386, or
# $FKVF_CROSS_DIR/sysroot-i386. ctest runs the Check suites through qemu
# (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR i686)
set(CMAKE_C_COMPILER i686-linux-gnu-gcc)
include(${CMAKE_CURRENT_LIST_DIR}/cross-common.cmake)
fkvf_cross_setup(i686-linux-gnu i386-linux-gnu i386 qemu-i386)
