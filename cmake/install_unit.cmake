# Run by `cmake --install` (cmake/install.cmake): installs deploy/systemd/tessera.service with
# the /usr/local paths of the server and its documentation replaced by the ones this install
# uses. In: TESSERA_UNIT_SOURCE, TESSERA_UNIT_DIR, TESSERA_BINDIR, TESSERA_DOCDIR (each
# relative to CMAKE_INSTALL_PREFIX unless absolute); DESTDIR is honoured.
foreach(dir TESSERA_UNIT_DIR TESSERA_BINDIR TESSERA_DOCDIR)
  if(NOT IS_ABSOLUTE "${${dir}}")
    set(${dir} "${CMAKE_INSTALL_PREFIX}/${${dir}}")
  endif()
endforeach()

file(READ "${TESSERA_UNIT_SOURCE}" unit)
foreach(path "/usr/local/bin/tessera-server" "/usr/local/share/doc/tessera/")
  string(FIND "${unit}" "${path}" at)
  if(at EQUAL -1)  # the unit changed: this script must change with it
    message(FATAL_ERROR "${TESSERA_UNIT_SOURCE} no longer names ${path}")
  endif()
endforeach()
string(REPLACE "/usr/local/bin/tessera-server" "${TESSERA_BINDIR}/tessera-server" unit "${unit}")
string(REPLACE "file:///usr/local/share/doc/tessera/" "file://${TESSERA_DOCDIR}/" unit "${unit}")

set(out "$ENV{DESTDIR}${TESSERA_UNIT_DIR}/tessera.service")
message(STATUS "Installing: ${out}")
file(WRITE "${out}" "${unit}")
list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${TESSERA_UNIT_DIR}/tessera.service")  # as file(INSTALL)
