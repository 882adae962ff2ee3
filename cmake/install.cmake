# SPDX-License-Identifier: Apache-2.0
# install() rules and the exported CMake package, included at the end of the top-level CMakeLists.txt.
#
# What `cmake --install` puts under the prefix (GNUInstallDirs names):
#   LIBDIR/libspindle_{base,numa,uring,core,net[,dpdk]}.a, or .so.VERSION with its SONAME link
#   INCLUDEDIR/spindle/<layer>/...h    every header of the library; private parts stay under the
#                                      layers' internal/ folders, which say so; includes rewritten to
#                                      "spindle/<layer>/..." so that they resolve from INCLUDEDIR alone
#   LIBDIR/cmake/spindle/              spindleConfig.cmake, spindleConfigVersion.cmake, spindleTargets*.cmake
#   LIBDIR/pkgconfig/spindle.pc        (and spindle-dpdk.pc where spindle::dpdk is built)
#   BINDIR/spindle-*                   the programs of apps/, where they are built
#   MANDIR/man1/spindle-*.1.gz         their man pages, where help2man is found (cmake/manpages.cmake)
#   DATADIR/spindle/gdb/spindle.py     the gdb extension (tools/gdb)
#   DOCDIR/LICENSE
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_spindle_libs spindle_base spindle_numa spindle_uring spindle_core spindle_net)
set(_spindle_layers base numa uring core net)
if(TARGET spindle_dpdk)
  list(APPEND _spindle_libs spindle_dpdk)
endif()
foreach(_lib IN LISTS _spindle_libs)
  string(REPLACE "spindle_" "" _name ${_lib})
  # SONAME libspindle_<name>.so.<major>: the ABI promise matches the package's SameMajorVersion.
  set_target_properties(${_lib} PROPERTIES EXPORT_NAME ${_name}
    VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
endforeach()
target_include_directories(spindle_base INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS ${_spindle_libs} EXPORT spindleTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT lib)

# Headers: the tree spells includes from the repository root ("core/io.h"); the installed copies say
# "spindle/core/io.h", which the include directory alone resolves, and so does a consumer's
# <spindle/core/io.h>. The rewrite runs at install time (cmake/install_headers.cmake).
set(_spindle_header_dirs ${_spindle_layers})
set(_spindle_header_excludes "")
if(NOT TARGET spindle_dpdk)
  list(APPEND _spindle_header_excludes net/dpdk)
endif()
install(CODE "
  set(SPINDLE_SOURCE_DIR \"${PROJECT_SOURCE_DIR}\")
  set(SPINDLE_STAGE_DIR \"${PROJECT_BINARY_DIR}/install-include\")
  set(SPINDLE_HEADER_DIRS \"${_spindle_header_dirs}\")
  set(SPINDLE_HEADER_EXCLUDES \"${_spindle_header_excludes}\")
  set(SPINDLE_INCLUDE_DEST \"${CMAKE_INSTALL_INCLUDEDIR}\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/install_headers.cmake\")
" COMPONENT dev)

# The programs of apps/ (every executable that apps/ and its subfolders define).
if(SPINDLE_BUILD_APPS)
  set(_spindle_apps "")
  set(_dirs ${PROJECT_SOURCE_DIR}/apps)
  while(_dirs)
    list(POP_FRONT _dirs _dir)
    get_property(_targets DIRECTORY ${_dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(_t IN LISTS _targets)
      get_target_property(_type ${_t} TYPE)
      if(_type STREQUAL "EXECUTABLE")
        list(APPEND _spindle_apps ${_t})
      endif()
    endforeach()
    get_property(_sub DIRECTORY ${_dir} PROPERTY SUBDIRECTORIES)
    list(APPEND _dirs ${_sub})
  endwhile()
  if(_spindle_apps)
    if(BUILD_SHARED_LIBS)
      # Installed beside the libraries in a prefix of their own, the programs find them relative to BINDIR.
      file(RELATIVE_PATH _rel ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
      set_target_properties(${_spindle_apps} PROPERTIES INSTALL_RPATH "$ORIGIN/${_rel}")
    endif()
    install(TARGETS ${_spindle_apps} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT apps)
    # Their man pages, where help2man is found (cmake/manpages.cmake).
    include(${PROJECT_SOURCE_DIR}/cmake/manpages.cmake)
  endif()
endif()

install(FILES ${PROJECT_SOURCE_DIR}/tools/gdb/spindle.py
  DESTINATION ${CMAKE_INSTALL_DATADIR}/spindle/gdb COMPONENT apps)
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT lib)

# ---- the CMake package -------------------------------------------------------
set(_spindle_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/spindle)
install(EXPORT spindleTargets NAMESPACE spindle:: DESTINATION ${_spindle_cmake_dir} COMPONENT dev)
set(SPINDLE_PACKAGE_HAS_DPDK OFF)
if(TARGET spindle_dpdk)
  set(SPINDLE_PACKAGE_HAS_DPDK ON)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/spindleConfig.cmake.in
  ${PROJECT_BINARY_DIR}/spindleConfig.cmake INSTALL_DESTINATION ${_spindle_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/spindleConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/spindleConfig.cmake ${PROJECT_BINARY_DIR}/spindleConfigVersion.cmake
  DESTINATION ${_spindle_cmake_dir} COMPONENT dev)

# ---- pkg-config --------------------------------------------------------------
# The prefix is found from the .pc file's own place, so an installed tree can move (dpkg -x, DESTDIR).
file(RELATIVE_PATH _spindle_pc_to_prefix ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" _spindle_pc_to_prefix "${_spindle_pc_to_prefix}")
set(SPINDLE_PC_PREFIX "\${pcfiledir}/${_spindle_pc_to_prefix}")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(SPINDLE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
endif()
set(SPINDLE_PC_CFLAGS "")
foreach(_def IN LISTS _spindle_abi_defs)
  string(APPEND SPINDLE_PC_CFLAGS " -D${_def}")
endforeach()
# libunwind is a private dependency of spindle::core: a shared libspindle_core carries it, a static one
# needs it on the consumer's link line, so there it is required outright (pkg-config --static would
# also pull in the static dependencies of hwloc and the others, which a program linking their shared
# libraries does not need).
if(BUILD_SHARED_LIBS)
  set(SPINDLE_PC_REQUIRES_STATIC "")
  set(SPINDLE_PC_REQUIRES_PRIVATE " libunwind")
else()
  set(SPINDLE_PC_REQUIRES_STATIC ", libunwind")
  set(SPINDLE_PC_REQUIRES_PRIVATE "")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/spindle.pc.in ${PROJECT_BINARY_DIR}/spindle.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/spindle.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
if(TARGET spindle_dpdk)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/spindle-dpdk.pc.in ${PROJECT_BINARY_DIR}/spindle-dpdk.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/spindle-dpdk.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endif()
