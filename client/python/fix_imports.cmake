# Copies protoc's Python output from SRC (a tessera/v1 directory) to DST (tessera/_proto),
# rewriting `from tessera.v1 import` to `from tessera._proto import`.
file(GLOB _files ${SRC}/*.py ${SRC}/*.pyi)
foreach(_f ${_files})
  get_filename_component(_name ${_f} NAME)
  file(READ ${_f} _text)
  string(REPLACE "from tessera.v1 import" "from tessera._proto import" _text "${_text}")
  file(WRITE ${DST}/${_name} "${_text}")
endforeach()
file(WRITE ${DST}/__init__.py "# Generated gRPC stubs for tessera.v1 (do not edit).\n")
