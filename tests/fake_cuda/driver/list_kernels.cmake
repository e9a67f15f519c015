# Lists the entry points of a CUDA source preprocessed with tests/fake_cuda/driver/device.h,
# which gives every __global__ function its own text section: writes one
# TESSERA_HOST_KERNEL(name) line per entry point to OUT, for the generated file that registers
# them with the fake driver.
#   cmake -DIN=<preprocessed source> -DOUT=<list> -P list_kernels.cmake
file(READ "${IN}" source)
string(REGEX MATCHALL
  "section *\\( *\"\\.text\\.tessera_kernel\" *\\) *\\) *\\) *void +[A-Za-z_][A-Za-z_0-9]* *\\("
  found "${source}")
set(list "")
foreach(match IN LISTS found)
  string(REGEX REPLACE ".*void +([A-Za-z_][A-Za-z_0-9]*) *\\($" "\\1" name "${match}")
  string(APPEND list "TESSERA_HOST_KERNEL(${name})\n")
endforeach()
if(list STREQUAL "")
  message(FATAL_ERROR "list_kernels.cmake: no __global__ function in ${IN}")
endif()
file(WRITE "${OUT}.new" "${list}")
file(COPY_FILE "${OUT}.new" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.new")
