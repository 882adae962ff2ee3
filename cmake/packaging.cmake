# SPDX-License-Identifier: Apache-2.0
# CPack: one Debian package, spindle_<version>_<arch>.deb, with everything `cmake --install` installs
# (cmake/install.cmake): the libraries, the headers, the CMake package, the pkg-config files, the programs
# with their man pages (where help2man is found) and the gdb extension. `cpack -G DEB` in a build tree configured without fault injection (the `package`
# preset) makes it; dpkg-shlibdeps adds the shared libraries' own dependencies, and the -dev packages
# that the headers include are listed below.
# A build with SPINDLE_FAULT_INJECTION carries test-only fault points: it gets no package rules.
if(SPINDLE_FAULT_INJECTION)
  message(STATUS "spindle: fault injection is compiled in (a test build): no CPack package from this tree; "
                 "use the `package` preset (or -DSPINDLE_FAULT_INJECTION=OFF)")
  return()
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME spindle)
set(CPACK_PACKAGE_VENDOR "The spindle authors")
set(CPACK_PACKAGE_CONTACT "The spindle authors")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "thread-per-core fiber I/O runtime for Linux (io_uring and epoll)")
set(CPACK_PACKAGE_DESCRIPTION "spindle runs stackful fibers on carriers pinned one per CPU, each with its own io_uring ring (or epoll where io_uring is unavailable). This package holds the libraries, their headers, the CMake package and pkg-config files, the spindle-* programs with their man pages and the gdb extension.")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# A shlibs file for the libspindle_*.so.<major> it ships, and the ldconfig trigger that goes with it.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(_spindle_deb_depends "liburing-dev (>= 2.3), libhwloc-dev (>= 2.0), libfmt-dev, libunwind-dev, pkg-config")
if(TARGET spindle_dpdk)
  string(APPEND _spindle_deb_depends ", libdpdk-dev (>= 22.11)")
endif()
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${_spindle_deb_depends}")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "gdb, python3")
# One package with every component.
set(CPACK_DEB_COMPONENT_INSTALL OFF)
include(CPack)
