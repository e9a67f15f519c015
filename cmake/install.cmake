# `cmake --install`: what the components' own install() rules do not cover. Those install
# tessera-server, the CUDA module (lib/tessera) and its kernel compiler (server/), the `tessera`
# CLI, the client library, its headers and its CMake package (client/, proto/). Here: the
# systemd units and the documentation. tests/install/check_install.sh checks the whole tree.

# ---- systemd units ---------------------------------------------------------------------------
# Relative to the install prefix by default (/usr/lib/systemd/system for a distribution package,
# /usr/local/lib/systemd/system for the default prefix; systemd reads both).
set(TESSERA_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
  "Where `cmake --install` puts the systemd units (relative: under the install prefix)")

install(FILES deploy/systemd/nvidia-mps.service DESTINATION ${TESSERA_SYSTEMD_UNIT_DIR})
# deploy/systemd/tessera.service names the server and its documentation under /usr/local, the
# default prefix; the installed copy names them where this install puts them. That is known
# only at install time (`cmake --install --prefix` may differ from CMAKE_INSTALL_PREFIX), hence
# a script rather than configure_file.
install(CODE "
  set(TESSERA_UNIT_SOURCE \"${PROJECT_SOURCE_DIR}/deploy/systemd/tessera.service\")
  set(TESSERA_UNIT_DIR \"${TESSERA_SYSTEMD_UNIT_DIR}\")
  set(TESSERA_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(TESSERA_DOCDIR \"${CMAKE_INSTALL_DOCDIR}\")
  include(\"${CMAKE_CURRENT_LIST_DIR}/install_unit.cmake\")")

# ---- Documentation ---------------------------------------------------------------------------
# share/doc/tessera: README.md and docs/ side by side (operations.md is where tessera.service's
# Documentation= points; benchmarks.md finds its figures in benchmarks/ as in the source tree).
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
