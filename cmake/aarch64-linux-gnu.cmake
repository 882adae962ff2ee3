# SPDX-License-Identifier: Apache-2.0
# CMake toolchain file: builds spindle for AArch64 Linux on an x86-64 Debian 12 host, and runs what it builds
# (the tests, gtest's test discovery) under qemu-user. The configure preset `aarch64` uses it;
# scripts/lib/deps.sh's spindle_install_cross_deps installs what it needs.
#
# There is no separate sysroot. Debian's multiarch puts the arm64 libraries and their .pc and CMake package
# files under /usr/lib/aarch64-linux-gnu on the host itself, next to the x86-64 ones, and the cross
# compiler's own C library under /usr/aarch64-linux-gnu. The compiler searches both already; CMake learns the
# aarch64-linux-gnu library architecture from it and looks for packages (fmt, GTest) there only.

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_ASM_COMPILER aarch64-linux-gnu-gcc)

# Programs (pkg-config, the compilers' helpers) are the host's; nothing searches for arm64 programs.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)

# pkg-config: only the arm64 .pc files and the architecture-independent ones, never the host's
# /usr/lib/x86_64-linux-gnu/pkgconfig. PKG_CONFIG_LIBDIR replaces the default search path;
# PKG_CONFIG_PATH would be searched first, so it must not point at host files either.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "")

# Run AArch64 programs under qemu-user. gtest_discover_tests and add_test use this emulator by themselves.
# No -L /usr/aarch64-linux-gnu: the arm64 -dev packages pull in libc6:arm64, whose program interpreter
# (/lib/ld-linux-aarch64.so.1) and libc.so.6 then sit on the host as a matching pair. With -L, qemu takes
# the interpreter from the cross compiler's tree (libc6-arm64-cross, a different glibc build) while the
# libraries still resolve to /lib/aarch64-linux-gnu, and that mixed pair hangs in fork() (seen with
# 2.36-8cross1 against 2.36-9+deb12u14): every death test would time out.
find_program(SPINDLE_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(NOT SPINDLE_QEMU_AARCH64)
  message(FATAL_ERROR "qemu-aarch64 not found: install qemu-user "
                      "(scripts/lib/deps.sh: spindle_install_cross_deps)")
endif()
# Through cmake/qemu-one-cpu.sh, which keeps each program on one host CPU: qemu-user does not give
# STLR/LDAR pairs the ordering ARMv8 does (see the script).
set(CMAKE_CROSSCOMPILING_EMULATOR "${CMAKE_CURRENT_LIST_DIR}/qemu-one-cpu.sh;${SPINDLE_QEMU_AARCH64}")
