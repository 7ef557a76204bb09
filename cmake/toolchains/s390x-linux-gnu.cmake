# Cross build for s390x (IBM Z: big-endian, 64-bit) with Debian's
# cross compiler, run under qemu user-mode emulation (scripts/test-cross.sh,
# which installs both through scripts/install-cross-deps.sh):
#   cmake -S . -B build-cross-s390x --toolchain cmake/toolchains/s390x-linux-gnu.cmake
# The target's own libraries (zlib, xxHash, Check, libarchive, libcurl) come
# from the sysroot that script unpacks: build-deps/cross/sysroot-s390x, or
# $FKVF_CROSS_DIR/sysroot-s390x. ctest runs the Check suites through qemu
# (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR s390x)
set(CMAKE_C_COMPILER s390x-linux-gnu-gcc)
include(${CMAKE_CURRENT_LIST_DIR}/cross-common.cmake)
fkvf_cross_setup(s390x-linux-gnu s390x-linux-gnu s390x qemu-s390x)
