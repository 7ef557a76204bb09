# What the cross toolchain files share: fkvf_cross_setup(TRIPLET MULTIARCH
# DEBARCH QEMU) points CMake and pkg-config at the cross C library
# (/usr/TRIPLET, from Debian's cross compiler packages) and at the unpacked
# Debian packages of architecture DEBARCH (scripts/install-cross-deps.sh),
# whose libraries live in lib/MULTIARCH, and runs target programs with QEMU.
macro(fkvf_cross_setup triplet multiarch debarch qemu)
  if(DEFINED ENV{FKVF_CROSS_DIR})
    set(_fkvf_cross_dir "$ENV{FKVF_CROSS_DIR}")
  else()
    get_filename_component(_fkvf_cross_dir "${CMAKE_CURRENT_LIST_DIR}/../../build-deps/cross" ABSOLUTE)
  endif()
  set(FKVF_CROSS_SYSROOT "${_fkvf_cross_dir}/sysroot-${debarch}")
  if(NOT EXISTS "${FKVF_CROSS_SYSROOT}/.packages")
    message(FATAL_ERROR "no ${debarch} sysroot at ${FKVF_CROSS_SYSROOT}: run scripts/install-cross-deps.sh")
  endif()
  set(CMAKE_LIBRARY_ARCHITECTURE ${multiarch})
  set(CMAKE_FIND_ROOT_PATH /usr/${triplet} "${FKVF_CROSS_SYSROOT}")
  set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
  set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
  set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
  set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
  # pkg-config: the target's .pc files, their paths under the sysroot
  set(ENV{PKG_CONFIG_LIBDIR}
      "${FKVF_CROSS_SYSROOT}/usr/lib/${multiarch}/pkgconfig:${FKVF_CROSS_SYSROOT}/usr/share/pkgconfig")
  set(ENV{PKG_CONFIG_SYSROOT_DIR} "${FKVF_CROSS_SYSROOT}")
  # the libraries' own dependencies at link time, and at run time without
  # an environment (the programs are run by hand too, under qemu)
  set(_fkvf_libdirs "${FKVF_CROSS_SYSROOT}/usr/lib/${multiarch}" "${FKVF_CROSS_SYSROOT}/lib/${multiarch}")
  # (DT_RPATH, not RUNPATH: it serves the libraries' own dependencies too)
  set(_fkvf_ldflags "-Wl,--disable-new-dtags")
  foreach(d IN LISTS _fkvf_libdirs)
    string(APPEND _fkvf_ldflags " -Wl,-rpath-link,${d} -Wl,-rpath,${d}")
  endforeach()
  set(CMAKE_EXE_LINKER_FLAGS_INIT "${_fkvf_ldflags}")
  set(CMAKE_SHARED_LINKER_FLAGS_INIT "${_fkvf_ldflags}")
  set(CMAKE_CROSSCOMPILING_EMULATOR ${qemu} -L /usr/${triplet})
endmacro()
