# cmake/install.cmake: what `cmake --install` puts into the prefix (included by the root CMakeLists.txt when
# ECOKV_INSTALL is ON, after every target exists). A consumer then writes
#   find_package(ecokv 0.1 REQUIRED)   # or COMPONENTS eval llama
#   target_link_libraries(app PRIVATE ecokv::ecokv ecokv::eval ecokv::llama)
#
#   lib/libecokv.a, lib/libecokv-eval.a, lib/libecokv-llama.a, include/ecokv/*.h   ecokv::ecokv, ::eval, ::llama
#   lib/cmake/ecokv/ecokv-config.cmake, -config-version.cmake, -targets*.cmake     find_package(ecokv)
#   bin/ecokv (tools/CMakeLists.txt; RUNPATH $ORIGIN/../lib)
#   share/ecokv/models/: tiny-vlm.gguf, tiny-vlm-mmproj.gguf, tiny-vlm-sample.png, tiny-qwen2vl.gguf,
#       tiny-qwen2vl-mmproj.gguf, tiny-qwen2vl-sample/ (the main job's page and questions), stories260K.gguf: the
#       models of `ecokv run` without --model (tools/common/bundled.cpp finds them from the installed binary)
#
# llama.cpp, when built here (routes a and c of cmake/llama.cmake): its five shared libraries libllama, libmtmd,
# libggml, libggml-base, libggml-cpu go to lib/ (RUNPATH $ORIGIN, set in cmake/llama.cmake) with the public
# headers llama.cpp's own install rules would install (llama.h, llama-cpp.h, ggml*.h, gguf.h, mtmd.h,
# mtmd-helper.h). llama.cpp's CMake packages are not installed, nor could its targets join our export set (their
# include directories are source-tree paths): ecokv-config.cmake describes the libraries with imported targets
# ecokv::libllama, ecokv::libmtmd, ecokv::libggml, which the exported ecokv::llama links.
# With an installed llama.cpp (route b) nothing of it is copied: ecokv-config.cmake finds that package again.
include_guard(GLOBAL)
include(CMakePackageConfigHelpers)

set(ECOKV_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/ecokv" CACHE STRING
    "where ecokv-config.cmake is installed, relative to the prefix")

install(TARGETS ecokv EXPORT ecokv-targets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/ecokv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# ecokv-eval and ecokv-llama install themselves into the same export set (eval/, adapters/llama/CMakeLists.txt).

# How the installed config reaches llama.cpp: "" (no ecokv::llama), "bundled" (installed here) or "installed".
set(ECOKV_CONFIG_LLAMA "")
set(ECOKV_CONFIG_LLAMA_LIBS "")
set(ECOKV_CONFIG_LLAMA_DIR "")
if (TARGET ecokv-llama AND ECOKV_LLAMA_INSTALLABLE)
    if (ECOKV_LLAMA_ROUTE STREQUAL "source")
        set(ECOKV_CONFIG_LLAMA bundled)
        foreach (t ggml-base ggml-cpu ${ECOKV_BACKEND_TARGET} ggml llama mtmd)  # dependency order
            if (NOT TARGET ${t})
                continue()
            endif()
            get_target_property(_type ${t} TYPE)
            if (NOT _type STREQUAL "SHARED_LIBRARY")
                message(FATAL_ERROR "ecokv: llama.cpp target ${t} is ${_type}, expected a shared library")
            endif()
            list(APPEND ECOKV_CONFIG_LLAMA_LIBS ${t})
        endforeach()
        # Their headers are those llama.cpp's own rules install: the targets' PUBLIC_HEADER. Relative paths there
        # are relative to the directory that set the property (ggml/ for ggml, whose target is in ggml/src/), not
        # to ours, so install(TARGETS ... PUBLIC_HEADER) can't take them. mtmd's PRIVATE_HEADER (debug) stays out.
        install(TARGETS ${ECOKV_CONFIG_LLAMA_LIBS}
                LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
                RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
                PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT llama-unused EXCLUDE_FROM_ALL
                PRIVATE_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT llama-unused EXCLUDE_FROM_ALL)
        foreach (t ${ECOKV_CONFIG_LLAMA_LIBS})
            get_target_property(_headers ${t} PUBLIC_HEADER)
            get_target_property(_dir ${t} SOURCE_DIR)
            if (_headers)
                foreach (h ${_headers})
                    set(_found "")
                    foreach (base "${_dir}" "${_dir}/..")
                        get_filename_component(_abs "${h}" ABSOLUTE BASE_DIR "${base}")
                        if (NOT _found AND EXISTS "${_abs}")
                            set(_found "${_abs}")
                        endif()
                    endforeach()
                    if (NOT _found)
                        message(FATAL_ERROR "ecokv: header ${h} of llama.cpp target ${t} not found near ${_dir}")
                    endif()
                    install(FILES "${_found}" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
                endforeach()
            endif()
        endforeach()
    else()
        set(ECOKV_CONFIG_LLAMA installed)
        set(ECOKV_CONFIG_LLAMA_DIR "${llama_DIR}")  # a hint for the consumer's find_package(llama)
    endif()
endif()

if (TARGET ecokv-cli AND TARGET ecokv-llama)
    install(FILES models/tiny-vlm.gguf models/tiny-vlm-mmproj.gguf models/tiny-vlm-sample.png models/stories260K.gguf
                  models/tiny-qwen2vl.gguf models/tiny-qwen2vl-mmproj.gguf
            DESTINATION ${CMAKE_INSTALL_DATADIR}/ecokv/models)
    install(DIRECTORY models/tiny-qwen2vl-sample DESTINATION ${CMAKE_INSTALL_DATADIR}/ecokv/models)
endif()

set(ECOKV_CONFIG_HAS_EVAL OFF)
if (TARGET ecokv-eval)
    set(ECOKV_CONFIG_HAS_EVAL ON)
endif()
set(ECOKV_CONFIG_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
set(ECOKV_CONFIG_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
configure_package_config_file(cmake/ecokv-config.cmake.in "${PROJECT_BINARY_DIR}/ecokv-config.cmake"
    INSTALL_DESTINATION "${ECOKV_INSTALL_CMAKEDIR}"
    PATH_VARS ECOKV_CONFIG_LIBDIR ECOKV_CONFIG_INCLUDEDIR)
# 0.x: a minor release may change the API, so only the same major.minor is compatible.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/ecokv-config-version.cmake"
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/ecokv-config.cmake" "${PROJECT_BINARY_DIR}/ecokv-config-version.cmake"
        DESTINATION "${ECOKV_INSTALL_CMAKEDIR}")
install(EXPORT ecokv-targets NAMESPACE ecokv:: FILE ecokv-targets.cmake DESTINATION "${ECOKV_INSTALL_CMAKEDIR}")
