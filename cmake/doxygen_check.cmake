# SPDX-License-Identifier: Apache-2.0
# Runs Doxygen on docs/Doxyfile for the `docs` target (cmake/docs.cmake) and fails when it warns: the
# Doxyfile sends warnings to OUTPUT_DIR/warnings.log (and fails on them itself), which is printed here.
# Usage: cmake -DDOXYGEN=... -DSOURCE_DIR=... -DOUTPUT_DIR=... -DVERSION=... -P cmake/doxygen_check.cmake
foreach(_var DOXYGEN SOURCE_DIR OUTPUT_DIR VERSION)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "doxygen_check.cmake: -D${_var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE ${OUTPUT_DIR}/html)  # no page of a header that is gone
file(MAKE_DIRECTORY ${OUTPUT_DIR})
file(REMOVE ${OUTPUT_DIR}/warnings.log)
set(ENV{SPINDLE_VERSION} ${VERSION})
set(ENV{SPINDLE_DOXYGEN_OUTPUT} ${OUTPUT_DIR})
execute_process(COMMAND ${DOXYGEN} ${SOURCE_DIR}/docs/Doxyfile WORKING_DIRECTORY ${SOURCE_DIR}
                RESULT_VARIABLE _rc)
set(_log "")
if(EXISTS ${OUTPUT_DIR}/warnings.log)
  file(READ ${OUTPUT_DIR}/warnings.log _log)
endif()
if(NOT _rc EQUAL 0 OR NOT _log STREQUAL "")
  message(FATAL_ERROR "spindle: Doxygen exited ${_rc} and warned (docs/Doxyfile: every warning is an error); "
                      "fix the comments it names:\n${_log}")
endif()
if(NOT EXISTS ${OUTPUT_DIR}/html/index.html)
  message(FATAL_ERROR "spindle: Doxygen made no ${OUTPUT_DIR}/html/index.html")
endif()
message(STATUS "spindle: API reference, no warnings: ${OUTPUT_DIR}/html/index.html")
