# npusim's ascendc.cmake, host side only. CANN's sample CMakeLists include it whether or not they
# build a kernel; npusim's toolkit has no AscendC device compiler, so a kernel library is refused
# with one clear message instead of a build that fails somewhere later.
if(NOT DEFINED ASCEND_CANN_PACKAGE_PATH)
  get_filename_component(ASCEND_CANN_PACKAGE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
endif()

# Samples link `ascendcl` (or `acl_rt`) by name after link_directories(<toolkit>/lib64).
link_directories(${ASCEND_CANN_PACKAGE_PATH}/lib64)

function(ascendc_library name)
  message(FATAL_ERROR "npusim: ascendc_library(${name} ...) needs an AscendC kernel compiler, "
                      "which npusim's toolkit does not have (host-only ascendc.cmake)")
endfunction()

function(ascendc_fatbin_library name)
  message(FATAL_ERROR "npusim: ascendc_fatbin_library(${name} ...) needs an AscendC kernel compiler, "
                      "which npusim's toolkit does not have (host-only ascendc.cmake)")
endfunction()
