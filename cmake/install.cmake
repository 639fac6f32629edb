# `cmake --install build [--prefix P]`: what goes where (docs/install.md).
#
#   P/bin/                ftrun, ftrun-agent, ftrun-chaos, ftrun-synthetic, ftrun-bench, ftrun-netdelay
#   P/lib/libftrun.so*    the client library a C++ or C trainer links
#   P/include/ftrun/      its public headers
#   P/lib/cmake/ftrun/    find_package(ftrun): ftrun::ftrun, ftrun::agent, ftrun::runner
#   P/FTRUN_INSTALL_PYTHONDIR/ftrun/, ftrun_chaos/   the Python package and the chaos harness
#   P/lib/ftrun/python/ftrun -> the package: what the agent puts on its ranks' PYTHONPATH
#   P/share/ftrun/configs/  the default config, examples and chaos plans
#
# Components (cmake --install build --component NAME): programs, library,
# development, python, chaos. setup.py installs `python` and `library`.
#
# Every path between installed files is relative ($ORIGIN RPATHs, the
# runner's and agent's own directory), so an install tree works at any
# prefix and can be moved.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FTRUN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/ftrun" CACHE STRING
    "where find_package(ftrun) files go, relative to the prefix")

# From directory `from` to directory `to`, both relative to the prefix: a
# path to append to $ORIGIN or to an executable's directory.
function(ftrun_relative_dir out from to)
  foreach(dir IN ITEMS "${from}" "${to}")
    if(IS_ABSOLUTE "${dir}")
      message(FATAL_ERROR "ftrun install layout: expected a directory relative to the install prefix "
                          "(CMAKE_INSTALL_BINDIR, CMAKE_INSTALL_LIBDIR, FTRUN_INSTALL_PYTHONDIR), got ${dir}")
    endif()
  endforeach()
  file(RELATIVE_PATH rel "/prefix/${from}" "/prefix/${to}")
  if(rel STREQUAL "")
    set(rel ".")
  endif()
  set(${out} "${rel}" PARENT_SCOPE)
endfunction()

ftrun_relative_dir(FTRUN_LIBDIR_FROM_BINDIR "${CMAKE_INSTALL_BINDIR}" "${CMAKE_INSTALL_LIBDIR}")

# libftrun: a versioned shared library (ABI may change between 0.x minors).
set_target_properties(ftrun PROPERTIES
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  INSTALL_RPATH_USE_LINK_PATH TRUE)  # keeps CUDA's runtime directory where it was linked from
install(TARGETS ftrun EXPORT ftrunTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT library NAMELINK_COMPONENT development
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ftrun DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT development FILES_MATCHING PATTERN "*.h")

# Programs. The runner starts the ftrun-agent next to itself; the
# benchmarks and the chaos harness start the programs next to themselves.
set_target_properties(ftrun-agent PROPERTIES EXPORT_NAME agent)
set_target_properties(ftrun-runner PROPERTIES EXPORT_NAME runner)
set(FTRUN_INSTALLED_PROGRAMS ftrun-runner ftrun-agent ftrun-synthetic ftrun-bench)
if(TARGET ftrun-netdelay)
  list(APPEND FTRUN_INSTALLED_PROGRAMS ftrun-netdelay)
endif()
set_target_properties(${FTRUN_INSTALLED_PROGRAMS} PROPERTIES INSTALL_RPATH "$ORIGIN/${FTRUN_LIBDIR_FROM_BINDIR}")
install(TARGETS ftrun-runner ftrun-agent EXPORT ftrunTargets
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT programs)
install(TARGETS ftrun-synthetic ftrun-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT programs)
if(TARGET ftrun-netdelay)
  install(TARGETS ftrun-netdelay RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT chaos)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/ftrun/configs
  COMPONENT programs)

# find_package(ftrun)
install(EXPORT ftrunTargets NAMESPACE ftrun:: DESTINATION ${FTRUN_INSTALL_CMAKEDIR} COMPONENT development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ftrunConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/ftrunConfig.cmake INSTALL_DESTINATION ${FTRUN_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/ftrunConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/ftrunConfig.cmake ${PROJECT_BINARY_DIR}/cmake/ftrunConfigVersion.cmake
  DESTINATION ${FTRUN_INSTALL_CMAKEDIR} COMPONENT development)

# The Python package and the chaos harness: into the directory the
# interpreter searches for this prefix (on Debian, with the default prefix
# /usr/local: lib/python3.X/dist-packages, which is on sys.path). For any
# other prefix, ranks started by the installed agent still find the package
# (launcher/common/install_paths.h); a shell needs PYTHONPATH or a venv
# (docs/install.md).
if(FTRUN_BUILD_PYTHON)
  if(NOT FTRUN_INSTALL_PYTHONDIR)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c
        "import os, sysconfig; print(os.path.relpath(sysconfig.get_path('platlib'), sysconfig.get_path('data')))"
      OUTPUT_VARIABLE dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0 OR dir STREQUAL "" OR dir MATCHES "^\\.\\.")
      set(dir "${CMAKE_INSTALL_LIBDIR}/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/site-packages")
    endif()
    set(FTRUN_INSTALL_PYTHONDIR "${dir}" CACHE STRING
        "where the ftrun and ftrun_chaos Python packages go, relative to the install prefix")
  endif()
  message(STATUS "ftrun: Python packages install into <prefix>/${FTRUN_INSTALL_PYTHONDIR}")
  ftrun_relative_dir(FTRUN_PYTHONDIR_FROM_BINDIR "${CMAKE_INSTALL_BINDIR}" "${FTRUN_INSTALL_PYTHONDIR}")
  ftrun_relative_dir(FTRUN_LIBDIR_FROM_PYPACKAGE "${FTRUN_INSTALL_PYTHONDIR}/ftrun" "${CMAKE_INSTALL_LIBDIR}")

  # The directory the agent appends to its ranks' PYTHONPATH: it holds only
  # `ftrun` (a link to the package above), so a rank gets the package that
  # matches its agent and nothing else of the site directory moves ahead of
  # the standard library.
  set(FTRUN_RANK_PYTHONDIR "${CMAKE_INSTALL_LIBDIR}/ftrun/python")
  ftrun_relative_dir(FTRUN_RANK_PYTHONDIR_FROM_BINDIR "${CMAKE_INSTALL_BINDIR}" "${FTRUN_RANK_PYTHONDIR}")
  ftrun_relative_dir(FTRUN_LIBDIR_FROM_RANK_PACKAGE "${FTRUN_RANK_PYTHONDIR}/ftrun" "${CMAKE_INSTALL_LIBDIR}")

  # $ORIGIN first: where setup.py puts libftrun (next to _ftrun in the wheel).
  # The loader takes $ORIGIN from the path the module was opened by, so the
  # link above needs its own entry.
  set(rpath "$ORIGIN" "$ORIGIN/${FTRUN_LIBDIR_FROM_PYPACKAGE}" "$ORIGIN/${FTRUN_LIBDIR_FROM_RANK_PACKAGE}")
  list(REMOVE_DUPLICATES rpath)
  set_target_properties(_ftrun PROPERTIES INSTALL_RPATH "${rpath}")
  install(TARGETS _ftrun LIBRARY DESTINATION ${FTRUN_INSTALL_PYTHONDIR}/ftrun COMPONENT python)
  install(FILES ${FTRUN_PY_SOURCES} DESTINATION ${FTRUN_INSTALL_PYTHONDIR}/ftrun COMPONENT python)
  ftrun_relative_dir(link "${FTRUN_RANK_PYTHONDIR}" "${FTRUN_INSTALL_PYTHONDIR}/ftrun")
  set_source_files_properties(launcher/common/install_paths.cc PROPERTIES
    COMPILE_DEFINITIONS "FTRUN_RANK_PYTHONDIR_FROM_BINDIR=\"${FTRUN_RANK_PYTHONDIR_FROM_BINDIR}\"")
  install(CODE "
    set(dir \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${FTRUN_RANK_PYTHONDIR}\")
    message(STATUS \"Installing: \${dir}/ftrun -> ${link}\")
    file(MAKE_DIRECTORY \"\${dir}\")
    file(CREATE_LINK \"${link}\" \"\${dir}/ftrun\" SYMBOLIC)" COMPONENT python)

  install(DIRECTORY ${PROJECT_SOURCE_DIR}/integration/chaos/ftrun_chaos DESTINATION ${FTRUN_INSTALL_PYTHONDIR}
    COMPONENT chaos FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/ftrun-chaos.in ${PROJECT_BINARY_DIR}/cmake/ftrun-chaos @ONLY)
  install(PROGRAMS ${PROJECT_BINARY_DIR}/cmake/ftrun-chaos DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT chaos)
endif()
