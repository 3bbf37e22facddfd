# npusim's ascendc.cmake: CANN's AscendC kernel library functions for npusim's toolkit.
#
# ascendc_library(NAME STATIC|SHARED SOURCES...) and ascendc_fatbin_library(NAME SOURCES...) build
# AscendC kernel sources with the host compiler instead of CANN's device compiler:
#
#  * each `__global__ __aicore__` kernel K becomes an npusim kernel K (npusim/kernel.h) in the
#    library's npusim device binary: the source compiled against npusim's host emulation of
#    kernel_operator.h (tikcpp/ascendc_kernel_cmake/npusim/, a subset of the AscendC API);
#  * a kernel source S that comes with S_STEM.npusim.cpp beside it (S's name without extension,
#    then .npusim.cpp), or a library NAME whose NPUSIM_KERNEL_SOURCES_<NAME> lists files, uses those
#    npusim kernels instead (for kernels the emulation cannot compile, or to run faster ones);
#  * ascendc_library's target holds the host side: the source's functions that launch with
#    K<<<blockDim, l2ctrl, stream>>>(args), and aclrtlaunch_K(blockDim, stream, args...) declared in
#    the generated aclrtlaunch_K.h (with ACLRT_LAUNCH_KERNEL(K)), the device binary embedded;
#  * ascendc_fatbin_library's target is the device binary itself, installed as
#    fatbin/NAME/NAME.o (what aclrtBinaryLoadFromFile reads in CANN's samples).
#
# A kernel with no npusim implementation (the emulation does not compile it and no .npusim.cpp
# is given) still builds: configuring says which, and its launch fails with
# ACL_ERROR_RT_FEATURE_NOT_SUPPORT and an aclGetRecentErrMsg saying how to supply one.
# ascendc_compile_definitions / ascendc_include_directories / ascendc_compile_options(NAME
# [PRIVATE|PUBLIC|INTERFACE] ...) apply to the kernel compilation, as in CANN.
if(NOT DEFINED ASCEND_CANN_PACKAGE_PATH)
  get_filename_component(ASCEND_CANN_PACKAGE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
endif()

# Samples link `ascendcl` (or `acl_rt`) by name after link_directories(<toolkit>/lib64).
link_directories(${ASCEND_CANN_PACKAGE_PATH}/lib64)

set(NPUSIM_ASCENDC_DIR ${CMAKE_CURRENT_LIST_DIR})
find_program(NPUSIM_ASCENDC_PYTHON NAMES python3 python)

function(_npusim_ascendc_generate name)
  if(NOT NPUSIM_ASCENDC_PYTHON)
    message(FATAL_ERROR "npusim: ascendc_library(${name}) needs python3 to read the kernel sources")
  endif()
  set(gen ${CMAKE_CURRENT_BINARY_DIR}/npusim_ascendc/${name})
  file(MAKE_DIRECTORY ${gen})
  set(stems)
  set(index 0)
  foreach(src IN LISTS ARGN)
    get_filename_component(src "${src}" ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    get_filename_component(base "${src}" NAME_WE)
    set(stem ${base}_${index})
    math(EXPR index "${index} + 1")
    execute_process(COMMAND ${NPUSIM_ASCENDC_PYTHON} ${NPUSIM_ASCENDC_DIR}/npusim_ascendc.py gen ${src} ${gen} ${stem}
                    RESULT_VARIABLE rc ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "npusim: ascendc library ${name}: cannot read kernel source ${src}: ${err}")
    endif()
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${src})
    list(APPEND stems ${stem})
    set_property(GLOBAL PROPERTY _npusim_ascendc_${name}_src_${stem} ${src})
  endforeach()
  set_property(GLOBAL PROPERTY _npusim_ascendc_${name}_stems ${stems})
  set_property(GLOBAL PROPERTY _npusim_ascendc_${name}_gen ${gen})
endfunction()

# The npusim sources of library name's device binary: given ones, or the generated ones that
# compile against the emulation (a configure-time check, so a kernel the emulation cannot compile
# leaves the build working and is named instead).
function(_npusim_ascendc_device_sources name out missing)
  get_property(stems GLOBAL PROPERTY _npusim_ascendc_${name}_stems)
  get_property(gen GLOBAL PROPERTY _npusim_ascendc_${name}_gen)
  get_property(extra_inc GLOBAL PROPERTY _npusim_ascendc_${name}_includes)
  get_property(extra_def GLOBAL PROPERTY _npusim_ascendc_${name}_definitions)
  get_property(extra_opt GLOBAL PROPERTY _npusim_ascendc_${name}_options)
  if(DEFINED NPUSIM_KERNEL_SOURCES_${name})
    set(result)
    foreach(f IN LISTS NPUSIM_KERNEL_SOURCES_${name})
      get_filename_component(f "${f}" ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
      list(APPEND result ${f})
    endforeach()
    set(${out} ${result} PARENT_SCOPE)
    set(${missing} "" PARENT_SCOPE)
    return()
  endif()
  get_directory_property(dir_inc INCLUDE_DIRECTORIES)
  set(flags -std=c++17 -fsyntax-only -I${NPUSIM_ASCENDC_DIR}/npusim -I${ASCEND_CANN_PACKAGE_PATH}/include)
  foreach(d IN LISTS dir_inc extra_inc)
    list(APPEND flags -I${d})
  endforeach()
  foreach(d IN LISTS extra_def)
    list(APPEND flags -D${d})
  endforeach()
  list(APPEND flags ${extra_opt})
  set(result)
  set(none)
  foreach(stem IN LISTS stems)
    get_property(src GLOBAL PROPERTY _npusim_ascendc_${name}_src_${stem})
    get_filename_component(dir "${src}" DIRECTORY)
    get_filename_component(base "${src}" NAME_WE)
    if(EXISTS ${dir}/${base}.npusim.cpp)
      list(APPEND result ${dir}/${base}.npusim.cpp)
      continue()
    endif()
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} ${flags} -I${dir} ${gen}/${stem}.device.cpp
                    RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
    if(rc EQUAL 0)
      list(APPEND result ${gen}/${stem}.device.cpp)
    else()
      list(APPEND none ${stem})
      file(READ ${gen}/${stem}.kernels kernels)
      string(REGEX REPLACE "[ \t][^\n]*" "" kernels "${kernels}")
      string(REPLACE "\n" " " kernels "${kernels}")
      string(REGEX MATCH "[^\n]*error[^\n]*" first "${err}")
      message(WARNING "npusim: ${src}: kernel(s) ${kernels}do not compile against npusim's AscendC emulation "
                      "(${first}); their launches fail until ${dir}/${base}.npusim.cpp provides them "
                      "as npusim kernels (npusim/kernel.h)")
    endif()
  endforeach()
  set(${out} ${result} PARENT_SCOPE)
  set(${missing} ${none} PARENT_SCOPE)
endfunction()

# The device binary of library name as MODULE target `target`, written to file.
function(_npusim_ascendc_module name target file sources)
  get_filename_component(dir "${file}" DIRECTORY)
  get_filename_component(fname "${file}" NAME)
  if(NOT sources)
    set(sources ${CMAKE_CURRENT_BINARY_DIR}/npusim_ascendc/${name}/no_kernels.cpp)
    file(WRITE ${sources} "// ${name}: no kernel has an npusim implementation\n")
  endif()
  add_library(${target} MODULE ${sources})
  get_property(gen GLOBAL PROPERTY _npusim_ascendc_${name}_gen)
  get_property(stems GLOBAL PROPERTY _npusim_ascendc_${name}_stems)
  foreach(stem IN LISTS stems)
    get_property(src GLOBAL PROPERTY _npusim_ascendc_${name}_src_${stem})
    get_filename_component(srcdir "${src}" DIRECTORY)
    target_include_directories(${target} PRIVATE ${srcdir})
  endforeach()
  target_include_directories(${target} PRIVATE ${NPUSIM_ASCENDC_DIR}/npusim ${ASCEND_CANN_PACKAGE_PATH}/include)
  get_property(extra_inc GLOBAL PROPERTY _npusim_ascendc_${name}_includes)
  get_property(extra_def GLOBAL PROPERTY _npusim_ascendc_${name}_definitions)
  get_property(extra_opt GLOBAL PROPERTY _npusim_ascendc_${name}_options)
  target_include_directories(${target} PRIVATE ${extra_inc})
  target_compile_definitions(${target} PRIVATE ${extra_def})
  target_compile_options(${target} PRIVATE -O2 ${extra_opt})
  set_target_properties(${target} PROPERTIES CXX_STANDARD 17 PREFIX "" SUFFIX ""
                        OUTPUT_NAME ${fname} LIBRARY_OUTPUT_DIRECTORY ${dir})
endfunction()

function(_npusim_ascendc_finish_library name)
  _npusim_ascendc_device_sources(${name} sources missing)
  get_property(gen GLOBAL PROPERTY _npusim_ascendc_${name}_gen)
  get_property(stems GLOBAL PROPERTY _npusim_ascendc_${name}_stems)
  foreach(stem IN LISTS missing)  # "-STEM": its kernels launch nothing
    list(TRANSFORM stems REPLACE "^${stem}$" "-${stem}")
  endforeach()
  set(binary -)
  if(sources)
    set(binary ${gen}/${name}.npusim.so)
    _npusim_ascendc_module(${name} ${name}_npusim_device ${binary} "${sources}")
    add_dependencies(${name} ${name}_npusim_device)
    set_source_files_properties(${gen}/${name}.launch.cpp PROPERTIES OBJECT_DEPENDS ${binary})
  endif()
  execute_process(COMMAND ${NPUSIM_ASCENDC_PYTHON} ${NPUSIM_ASCENDC_DIR}/npusim_ascendc.py launch ${gen} ${name}
                          ${binary} ${stems} RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "npusim: ascendc library ${name}: ${err}")
  endif()
endfunction()

function(_npusim_ascendc_finish_fatbin name)
  _npusim_ascendc_device_sources(${name} sources missing)
  set(file ${CMAKE_CURRENT_BINARY_DIR}/fatbin/${name}/${name}.o)
  _npusim_ascendc_module(${name} ${name} ${file} "${sources}")
  install(FILES ${file} DESTINATION fatbin/${name})
endfunction()

# Kernel compilation settings are gathered until the end of the directory, where the device
# binaries are set up (CMake >= 3.19; before that, at the library's own line).
macro(_npusim_ascendc_later fn name)
  if(CMAKE_VERSION VERSION_LESS 3.19)
    cmake_language(CALL ${fn} ${name})
  else()
    cmake_language(DEFER CALL ${fn} ${name})
  endif()
endmacro()

function(ascendc_library name type)
  if(NOT type MATCHES "^(STATIC|SHARED|OBJECT)$")
    message(FATAL_ERROR "npusim: ascendc_library(${name} ${type} ...): the type must be STATIC, SHARED or OBJECT")
  endif()
  _npusim_ascendc_generate(${name} ${ARGN})
  get_property(gen GLOBAL PROPERTY _npusim_ascendc_${name}_gen)
  get_property(stems GLOBAL PROPERTY _npusim_ascendc_${name}_stems)
  set(host)
  set(srcdirs)
  foreach(stem IN LISTS stems)
    list(APPEND host ${gen}/${stem}.host.cpp)
    get_property(src GLOBAL PROPERTY _npusim_ascendc_${name}_src_${stem})
    get_filename_component(srcdir "${src}" DIRECTORY)
    list(APPEND srcdirs ${srcdir})
  endforeach()
  file(TOUCH ${gen}/${name}.launch.cpp)  # written in full at the end of the directory
  add_library(${name} ${type} ${host} ${gen}/${name}.launch.cpp)
  target_include_directories(${name} PUBLIC ${gen}/include ${ASCEND_CANN_PACKAGE_PATH}/include)
  target_include_directories(${name} PRIVATE ${NPUSIM_ASCENDC_DIR}/npusim ${srcdirs})
  target_link_libraries(${name} PUBLIC ${ASCEND_CANN_PACKAGE_PATH}/lib64/libascendcl.so)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  _npusim_ascendc_later(_npusim_ascendc_finish_library ${name})
endfunction()

function(ascendc_fatbin_library name)
  _npusim_ascendc_generate(${name} ${ARGN})
  _npusim_ascendc_later(_npusim_ascendc_finish_fatbin ${name})
endfunction()

# ascendc_compile_definitions(NAME [PRIVATE|PUBLIC|INTERFACE] DEFS...) and friends: for the kernels.
function(_npusim_ascendc_setting kind name)
  set(values ${ARGN})
  list(REMOVE_ITEM values PRIVATE PUBLIC INTERFACE)
  if(kind STREQUAL "includes")
    set(abs)
    foreach(v IN LISTS values)
      get_filename_component(v "${v}" ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
      list(APPEND abs ${v})
    endforeach()
    set(values ${abs})
  elseif(kind STREQUAL "definitions")
    list(TRANSFORM values REPLACE "^-D" "")
  endif()
  set_property(GLOBAL APPEND PROPERTY _npusim_ascendc_${name}_${kind} ${values})
endfunction()

function(ascendc_compile_definitions name)
  _npusim_ascendc_setting(definitions ${name} ${ARGN})
endfunction()

function(ascendc_include_directories name)
  _npusim_ascendc_setting(includes ${name} ${ARGN})
endfunction()

function(ascendc_compile_options name)
  _npusim_ascendc_setting(options ${name} ${ARGN})
endfunction()
