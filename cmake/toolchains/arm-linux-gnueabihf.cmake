# Cross build for armhf (32-bit ARMv7 with VFP: 4-byte size_t and pointers,
# 32-bit long, unsigned plain char) with Debian's cross compiler, run under
# qemu user-mode emulation (scripts/test-cross.sh, which installs both
# through scripts/install-cross-deps.sh):
#   cmake -S . -B build-cross-armhf --toolchain cmake/toolchains/arm-linux-gnueabihf.cmake
# The target's own libraries (zlib, xxHash, Check, libarchive, libcurl) come
# from the sysroot that script unpacks: build-deps/cross/sysroot-armhf, or
# $FKVF_CROSS_DIR/sysroot-armhf. ctest runs the Check suites through qemu
# (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR arm)
set(CMAKE_C_COMPILER arm-linux-gnueabihf-gcc)
include(${CMAKE_CURRENT_LIST_DIR}/cross-common.cmake)
fkvf_cross_setup(arm-linux-gnueabihf arm-linux-gnueabihf armhf qemu-arm)
