# cmake/llama.cmake: provides the targets `llama`, `mtmd` and `ggml` (llama.cpp 0.5.0).
#
# Routes, first match wins:
#   (a) -DECOKV_LLAMA_SOURCE_DIR=/path   build that source tree as a subdirectory
#   (b) -DECOKV_LLAMA_INSTALLED=ON       use an installed llama.cpp (find_package + find_library(mtmd))
#   (d) -DECOKV_LLAMA_PREBUILT_DIR=/dir   link the shared libraries another ecokv build made there (its bin/),
#                                        headers from third_party/llama.cpp: the sanitizer job shares the
#                                        ordinary build's llama.cpp instead of building it again
#   (c) default                          build ${ECOKV_ROOT}/third_party/llama.cpp; scripts/fetch-llama.sh
#                                        is run at configure time to fetch it / re-apply patches
# Inputs:  ECOKV_ROOT (repo root; defaults to the parent of this file, so a consumer project whose
#          PROJECT_SOURCE_DIR is elsewhere, like cmake/test-llama, needs no setting),
#          ECOKV_LLAMA_NATIVE (-march=native, OFF), ECOKV_LLAMA_SHARED (shared libs, ON).
# Output:  ECOKV_LLAMA_SRC = the llama.cpp source dir (for internal headers under src/), or ""
#          for the installed route, where internal headers are not available.
#          ECOKV_LLAMA_ROUTE = "source" (a, c: llama.cpp built here) or "installed" (b); cmake/install.cmake
#          installs the built libraries into ecokv's prefix (source) or refers to the installed package.
#          ECOKV_LLAMA_INSTALLABLE = whether ecokv::llama can be installed: not with static llama.cpp
#          libraries built here (ECOKV_LLAMA_SHARED=OFF), whose own dependencies we do not install.
include_guard(GLOBAL)

if(NOT DEFINED ECOKV_ROOT)
  get_filename_component(ECOKV_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
endif()

set(ECOKV_LLAMA_SOURCE_DIR "" CACHE PATH "Existing llama.cpp 0.5.0 source tree to build (route a)")
option(ECOKV_LLAMA_INSTALLED "Use an installed llama.cpp via find_package (route b)" OFF)
option(ECOKV_LLAMA_NATIVE "Build ggml with -march=native (non-portable binaries)" OFF)
# Shared by default: test executables stay small and link fast, a patched libllama relinks once
# instead of into every test, the code is PIC (usable from our own shared modules), and it is the
# same shape as the installed route. CMake sets the build-tree RPATH, so tests run in place.
option(ECOKV_LLAMA_SHARED "Build llama/mtmd/ggml as shared libraries (routes a, c)" ON)
# The GPU backend ggml is built with besides the CPU (routes a, c): llama.cpp's GGML_VULKAN, GGML_CUDA or GGML_METAL.
# docs/gpu.md says what each needs; scripts/setup.sh --backend installs it on Debian.
set(ECOKV_BACKEND "cpu" CACHE STRING "ggml backend besides the CPU: cpu, vulkan, cuda or metal")
set_property(CACHE ECOKV_BACKEND PROPERTY STRINGS cpu vulkan cuda metal)
set(_ecokv_backend_flag_cpu "")
set(_ecokv_backend_flag_vulkan GGML_VULKAN)
set(_ecokv_backend_flag_cuda GGML_CUDA)
set(_ecokv_backend_flag_metal GGML_METAL)
if(NOT DEFINED _ecokv_backend_flag_${ECOKV_BACKEND})
  message(FATAL_ERROR "ecokv: ECOKV_BACKEND '${ECOKV_BACKEND}' is not one of cpu, vulkan, cuda, metal")
endif()
set(ECOKV_BACKEND_TARGET "")  # the backend's ggml library, installed beside the others
if(NOT ECOKV_BACKEND STREQUAL "cpu")
  set(ECOKV_BACKEND_TARGET ggml-${ECOKV_BACKEND})
endif()

# Adds the tree with the options of the notes (§7). The function scope keeps these variables
# (BUILD_SHARED_LIBS, CMAKE_CXX_STANDARD, ...) away from the rest of our project; llama.cpp's
# option() calls honour normal variables (policy CMP0077 is NEW there).
function(_ecokv_add_llama_subdir src)
  if(NOT EXISTS "${src}/CMakeLists.txt" OR NOT EXISTS "${src}/tools/mtmd/mtmd.h")
    message(FATAL_ERROR "ecokv: '${src}' is not a llama.cpp source tree (no CMakeLists.txt or tools/mtmd)")
  endif()
  file(STRINGS "${src}/CMakeLists.txt" _v REGEX "^set\\(LLAMA_VERSION_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE "[^;]*_(MAJOR|MINOR|PATCH) ([0-9]+)\\)" "\\2" _v "${_v}")
  string(REPLACE ";" "." _v "${_v}")
  if(NOT _v STREQUAL "0.5.0")
    message(WARNING "ecokv: ${src} is llama.cpp '${_v}', the project is pinned to 0.5.0")
  endif()
  set(BUILD_SHARED_LIBS ${ECOKV_LLAMA_SHARED})
  set(CMAKE_CXX_STANDARD 17)            # llama.cpp is C++17 code; don't compile it as our C++20
  set(GGML_NATIVE ${ECOKV_LLAMA_NATIVE})
  foreach(b vulkan cuda metal)
    if(ECOKV_BACKEND STREQUAL b)
      set(${_ecokv_backend_flag_${b}} ON)
    else()
      set(${_ecokv_backend_flag_${b}} OFF)
    endif()
  endforeach()
  # Installed next to each other (cmake/install.cmake): libllama and libmtmd find libggml* by $ORIGIN.
  set(CMAKE_INSTALL_RPATH "$ORIGIN")
  set(LLAMA_BUILD_MTMD ON)              # libmtmd without the tools/ tree
  foreach(v LLAMA_BUILD_COMMON LLAMA_BUILD_TESTS LLAMA_BUILD_TOOLS LLAMA_BUILD_EXAMPLES
            LLAMA_BUILD_SERVER LLAMA_BUILD_APP LLAMA_SUBPROCESS LLAMA_OPENSSL MTMD_VIDEO
            GGML_BUILD_TESTS GGML_BUILD_EXAMPLES)
    set(${v} OFF)                       # no network/HTTP/ffmpeg, nothing but the libs
  endforeach()
  # EXCLUDE_FROM_ALL: only what we link gets built, and none of llama.cpp's own install rules run
  # (cmake/install.cmake installs the five libraries ecokv::llama needs, and their public headers).
  add_subdirectory("${src}" "${CMAKE_BINARY_DIR}/_llama.cpp" EXCLUDE_FROM_ALL)
endfunction()

set(ECOKV_LLAMA_PREBUILT_DIR "" CACHE PATH "Shared llama.cpp libraries of another ecokv build (route d)")

# An imported shared library of route (d): lib<name>.so in the prebuilt directory.
function(_ecokv_import_prebuilt name includes deps)
  set(lib "${ECOKV_LLAMA_PREBUILT_DIR}/lib${name}.so")
  if(NOT EXISTS "${lib}")
    message(FATAL_ERROR "ecokv: ${lib} not found (ECOKV_LLAMA_PREBUILT_DIR must hold an ecokv build's llama.cpp)")
  endif()
  add_library(${name} SHARED IMPORTED GLOBAL)
  set_target_properties(${name} PROPERTIES IMPORTED_LOCATION "${lib}" INTERFACE_INCLUDE_DIRECTORIES "${includes}"
                                           INTERFACE_LINK_LIBRARIES "${deps}")
endfunction()

if(ECOKV_LLAMA_PREBUILT_DIR)                                 # (d) another build's libraries
  set(ECOKV_LLAMA_SRC "${ECOKV_ROOT}/third_party/llama.cpp")
  _ecokv_import_prebuilt(ggml-base "${ECOKV_LLAMA_SRC}/ggml/include" "")
  _ecokv_import_prebuilt(ggml-cpu "" "ggml-base")
  _ecokv_import_prebuilt(ggml "" "ggml-base;ggml-cpu")
  _ecokv_import_prebuilt(llama "${ECOKV_LLAMA_SRC}/include" "ggml")
  _ecokv_import_prebuilt(mtmd "${ECOKV_LLAMA_SRC}/tools/mtmd" "llama;ggml")
  message(STATUS "ecokv: llama.cpp libraries from ${ECOKV_LLAMA_PREBUILT_DIR}")
  set(ECOKV_LLAMA_ROUTE prebuilt)

elseif(ECOKV_LLAMA_SOURCE_DIR)                               # (a) given source tree
  get_filename_component(ECOKV_LLAMA_SRC "${ECOKV_LLAMA_SOURCE_DIR}" ABSOLUTE)
  message(STATUS "ecokv: llama.cpp from source dir ${ECOKV_LLAMA_SRC}")
  _ecokv_add_llama_subdir("${ECOKV_LLAMA_SRC}")
  set(ECOKV_LLAMA_ROUTE source)

elseif(ECOKV_LLAMA_INSTALLED)                                # (b) installed package
  set(ECOKV_LLAMA_SRC "")
  set(ECOKV_LLAMA_ROUTE installed)
  find_package(llama 0.5 REQUIRED CONFIG)                    # imported `llama`, pulls in ggml::*
  # llama.cpp installs libmtmd and mtmd.h but no CMake package for them.
  find_library(ECOKV_MTMD_LIBRARY mtmd HINTS "${LLAMA_LIB_DIR}" REQUIRED)
  find_path(ECOKV_MTMD_INCLUDE_DIR mtmd.h HINTS "${LLAMA_INCLUDE_DIR}" REQUIRED)
  if(NOT TARGET mtmd)
    add_library(mtmd UNKNOWN IMPORTED)
    set_target_properties(mtmd PROPERTIES
      IMPORTED_LOCATION "${ECOKV_MTMD_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${ECOKV_MTMD_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "llama;ggml::ggml")
  endif()
  # The installed libllama/libmtmd have an empty RUNPATH, and our RUNPATH (DT_RUNPATH) is not
  # used for their own deps (libggml*), so a prefix outside the loader's path fails at run time.
  # Old-style DT_RPATH applies to transitive deps too.
  if(LLAMA_SHARED_LIB AND NOT LLAMA_LIB_DIR IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
    set_property(TARGET llama mtmd APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:--disable-new-dtags")
  endif()
  if(NOT TARGET ggml AND TARGET ggml::ggml)
    add_library(ggml ALIAS ggml::ggml)                       # same name as the source routes
  endif()
  message(STATUS "ecokv: llama.cpp installed ${LLAMA_VERSION} (${llama_LIBRARY}), mtmd ${ECOKV_MTMD_LIBRARY}")

else()                                                       # (c) third_party, fetched on demand
  set(ECOKV_LLAMA_SRC "${ECOKV_ROOT}/third_party/llama.cpp")
  # Run on every configure (a no-op in ~0.1 s when up to date) so that a changed patch set is
  # re-applied; the patch files are configure dependencies, so editing one re-runs CMake.
  execute_process(COMMAND bash "${ECOKV_ROOT}/scripts/fetch-llama.sh" --dir "${ECOKV_LLAMA_SRC}"
                  RESULT_VARIABLE _ecokv_rc)
  if(NOT _ecokv_rc EQUAL 0)
    message(FATAL_ERROR "ecokv: scripts/fetch-llama.sh failed (exit ${_ecokv_rc}); see its message "
      "above. Fix it and run it by hand, or pass -DECOKV_LLAMA_SOURCE_DIR=<llama.cpp 0.5.0 tree> "
      "or -DECOKV_LLAMA_INSTALLED=ON.")
  endif()
  file(GLOB _ecokv_patches "${ECOKV_ROOT}/patches/llama.cpp/*.patch")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
               "${ECOKV_ROOT}/scripts/fetch-llama.sh" ${_ecokv_patches})
  if(EXISTS "${ECOKV_ROOT}/patches/llama.cpp")               # catches added/removed patches
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${ECOKV_ROOT}/patches/llama.cpp")
  endif()
  message(STATUS "ecokv: llama.cpp from ${ECOKV_LLAMA_SRC}")
  _ecokv_add_llama_subdir("${ECOKV_LLAMA_SRC}")
  set(ECOKV_LLAMA_ROUTE source)
endif()

if((ECOKV_LLAMA_ROUTE STREQUAL "source" AND NOT ECOKV_LLAMA_SHARED) OR ECOKV_LLAMA_ROUTE STREQUAL "prebuilt")
  set(ECOKV_LLAMA_INSTALLABLE OFF)
else()
  set(ECOKV_LLAMA_INSTALLABLE ON)
endif()

foreach(t llama mtmd ggml)
  if(NOT TARGET ${t})
    message(FATAL_ERROR "ecokv: llama.cmake did not provide target '${t}'")
  endif()
endforeach()
