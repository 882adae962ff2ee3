# SPDX-License-Identifier: Apache-2.0
# Installs the library's headers under <prefix>/<SPINDLE_INCLUDE_DEST>/spindle/, run by `cmake --install`
# (an install(CODE) rule of cmake/install.cmake). Each header's includes of the library's own headers,
# written from the repository root ("core/io.h"), become "spindle/core/io.h", so that the installed tree
# needs no include directory but its own. The copies are made in SPINDLE_STAGE_DIR first, then installed
# with file(INSTALL), which honours DESTDIR and records each file in the install manifest.
#
# Inputs: SPINDLE_SOURCE_DIR, SPINDLE_STAGE_DIR, SPINDLE_HEADER_DIRS (the layers' folders),
# SPINDLE_HEADER_EXCLUDES (folders left out, e.g. net/dpdk where spindle::dpdk is not built),
# SPINDLE_INCLUDE_DEST (relative to the prefix, or absolute).
# Errors: a header that cannot be read or written stops the install with CMake's own error.

set(_layers_regex "")
foreach(_layer IN LISTS SPINDLE_HEADER_DIRS)
  if(_layers_regex)
    string(APPEND _layers_regex "|")
  endif()
  string(APPEND _layers_regex "${_layer}")
endforeach()

file(REMOVE_RECURSE "${SPINDLE_STAGE_DIR}")
foreach(_layer IN LISTS SPINDLE_HEADER_DIRS)
  file(GLOB_RECURSE _headers RELATIVE "${SPINDLE_SOURCE_DIR}" "${SPINDLE_SOURCE_DIR}/${_layer}/*.h")
  foreach(_rel IN LISTS _headers)
    set(_skip FALSE)
    foreach(_ex IN LISTS SPINDLE_HEADER_EXCLUDES)
      string(FIND "${_rel}" "${_ex}/" _at)
      if(_at EQUAL 0)
        set(_skip TRUE)
      endif()
    endforeach()
    if(_skip)
      continue()
    endif()
    file(READ "${SPINDLE_SOURCE_DIR}/${_rel}" _text)
    string(REGEX REPLACE "(#[ \t]*include[ \t]+\")(${_layers_regex})/" "\\1spindle/\\2/" _text "${_text}")
    file(WRITE "${SPINDLE_STAGE_DIR}/spindle/${_rel}" "${_text}")
  endforeach()
endforeach()

if(IS_ABSOLUTE "${SPINDLE_INCLUDE_DEST}")
  set(_dest "${SPINDLE_INCLUDE_DEST}")
else()
  set(_dest "${CMAKE_INSTALL_PREFIX}/${SPINDLE_INCLUDE_DEST}")
endif()
file(INSTALL DESTINATION "${_dest}" TYPE DIRECTORY FILES "${SPINDLE_STAGE_DIR}/spindle")
