# SPDX-License-Identifier: Apache-2.0
# The `docs` target: the API reference, Doxygen over the public headers (docs/Doxyfile), as HTML in
# <build>/docs/html. Only where Doxygen is found (Debian: doxygen); no graphviz needed. The target fails
# when Doxygen warns (cmake/doxygen_check.cmake), so a warning-free reference is something the build
# checks: scripts/test builds it in the release flavour. The HTML is not installed.
find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
  message(STATUS "spindle: Doxygen not found: no `docs` target (the API reference; Debian: doxygen)")
  return()
endif()
add_custom_target(docs
  COMMAND ${CMAKE_COMMAND} -DDOXYGEN=$<TARGET_FILE:Doxygen::doxygen> -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
          -DOUTPUT_DIR=${PROJECT_BINARY_DIR}/docs -DVERSION=${PROJECT_VERSION}
          -P ${PROJECT_SOURCE_DIR}/cmake/doxygen_check.cmake
  COMMENT "spindle: API reference (Doxygen ${DOXYGEN_VERSION}) in ${PROJECT_BINARY_DIR}/docs/html"
  VERBATIM)
message(STATUS "spindle: `docs` target: the API reference with Doxygen ${DOXYGEN_VERSION}")
