# SPDX-License-Identifier: Apache-2.0
# Man pages for the programs of apps/, made at build time by help2man from each program's --help-all
# (--help for spindle-hello, which has no subcommands) and --version, with docs/man/common.h2m (EXIT STATUS,
# ENVIRONMENT) and docs/man/<program>.h2m (NAME, DESCRIPTION, SEE ALSO) added. Each page is gzip'ed, as
# Debian wants, and installed as MANDIR/man1/<program>.1.gz with the programs (component apps).
#
# Included by cmake/install.cmake with _spindle_apps set (the installed programs). Without help2man
# (Debian: help2man) or gzip, or in a cross build (the programs cannot run here), there are no pages, and
# configure says so. With the tests, man:Pages.RenderCleanlyAndNameEveryFlag renders each page with
# groff and checks it warns of nothing and names every flag the program's help does (tests/man/).

find_program(SPINDLE_HELP2MAN help2man)
find_program(SPINDLE_GZIP gzip)
if(CMAKE_CROSSCOMPILING AND NOT CMAKE_CROSSCOMPILING_EMULATOR)
  message(STATUS "spindle: cross build: no man pages (help2man runs the programs)")
  return()
endif()
if(NOT SPINDLE_HELP2MAN OR NOT SPINDLE_GZIP)
  message(STATUS "spindle: help2man or gzip not found: the man pages are not built (Debian: help2man, gzip)")
  return()
endif()

set(_spindle_man_dir ${PROJECT_BINARY_DIR}/man)
file(MAKE_DIRECTORY ${_spindle_man_dir})
set(_spindle_man_sources ${PROJECT_SOURCE_DIR}/docs/man)
set(_spindle_man_pages "")
set(_spindle_man_gz "")
foreach(_app IN LISTS _spindle_apps)
  set(_page ${_spindle_man_dir}/${_app}.1)
  set(_help_option --help-all)
  if(_app STREQUAL "spindle-hello")
    set(_help_option --help)
  endif()
  set(_include ${_spindle_man_sources}/${_app}.h2m)
  if(NOT EXISTS ${_include})
    message(FATAL_ERROR "spindle: ${_app} is installed but has no docs/man/${_app}.h2m (its man page's NAME, "
                        "DESCRIPTION and SEE ALSO)")
  endif()
  # SPINDLE_LOG=error: a warning the runtime logs would not be help text. help2man reads stdout only.
  add_custom_command(OUTPUT ${_page} ${_page}.gz
    COMMAND ${CMAKE_COMMAND} -E env SPINDLE_LOG=error
            ${SPINDLE_HELP2MAN} --no-info --section=1 --manual=spindle "--source=spindle ${PROJECT_VERSION}"
            --help-option=${_help_option} --include=${_spindle_man_sources}/common.h2m --include=${_include}
            --output=${_page} $<TARGET_FILE:${_app}>
    COMMAND ${SPINDLE_GZIP} -9 -n -f -k ${_page}
    DEPENDS ${_app} ${_include} ${_spindle_man_sources}/common.h2m
    COMMENT "spindle: man page ${_app}.1" VERBATIM)
  list(APPEND _spindle_man_pages ${_page})
  list(APPEND _spindle_man_gz ${_page}.gz)
endforeach()
add_custom_target(spindle_man_pages ALL DEPENDS ${_spindle_man_pages} ${_spindle_man_gz})
install(FILES ${_spindle_man_gz} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT apps)
message(STATUS "spindle: man pages for ${_spindle_apps} (help2man)")

if(SPINDLE_BUILD_TESTS)
  find_program(SPINDLE_GROFF groff)
  find_package(Python3 COMPONENTS Interpreter)
  if(SPINDLE_GROFF AND Python3_Interpreter_FOUND)
    set(_args "")
    foreach(_app IN LISTS _spindle_apps)
      set(_help help-all)
      if(_app STREQUAL "spindle-hello")
        set(_help help)
      endif()
      list(APPEND _args --page ${_spindle_man_dir}/${_app}.1.gz $<TARGET_FILE:${_app}> ${_help})
    endforeach()
    add_test(NAME man:Pages.RenderCleanlyAndNameEveryFlag
             COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/tests/man/check_man_pages.py --groff ${SPINDLE_GROFF}
                     ${_args})
    set_tests_properties(man:Pages.RenderCleanlyAndNameEveryFlag PROPERTIES LABELS "apps,unit" TIMEOUT 120
                         ENVIRONMENT "SPINDLE_LOG=error")
    # The checker itself: a page with a groff warning, one missing a flag and one missing a section fail it.
    add_test(NAME man:Pages.CheckerCatchesWarningsAndMissingFlags
             COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/tests/man/check_man_pages.py --groff ${SPINDLE_GROFF}
                     --self-test)
    set_tests_properties(man:Pages.CheckerCatchesWarningsAndMissingFlags PROPERTIES LABELS "apps,unit" TIMEOUT 60)
  else()
    message(STATUS "spindle: groff or python3 not found: the man pages are built but not checked")
  endif()
endif()
