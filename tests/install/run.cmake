# ctest driver (cmake -P), registered by tests/CMakeLists.txt:
#   MODE=installed  `cmake --install` this build into a fresh prefix, build tests/install/consumer against it with
#                   find_package(ecokv) and run it; then move the prefix elsewhere and run its bin/ecokv: the
#                   bundled-model `ecokv run` must work from the moved prefix (RUNPATH $ORIGIN, share/ecokv/models),
#                   and must be reading the models of that prefix, not the source tree's.
#   MODE=subdir     build the consumer with add_subdirectory(<source tree>), ecokv::llama off (build time).
# Inputs: MODE, BUILD_DIR (this build), SOURCE_DIR (repo root), WORK_DIR (scratch, wiped), GENERATOR,
#         MAKE_PROGRAM, CXX_COMPILER, BUILD_TYPE, LLAMA (ON: the build has ecokv::llama), CLI (path of bin/ecokv or
#         empty). ccache is used when found (CCACHE_PROGRAM), not required.
cmake_minimum_required(VERSION 3.22)

foreach (v MODE BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
    if (NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
        message(FATAL_ERROR "run.cmake: -D${v}=... is required")
    endif()
endforeach()

function(step)  # step(<what> COMMAND ...): runs it, echoes its output, fails the test on a non-zero exit.
    cmake_parse_arguments(PARSE_ARGV 1 s "" "" "COMMAND")
    string(TIMESTAMP t0 "%s")
    execute_process(COMMAND ${s_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(TIMESTAMP t1 "%s")
    math(EXPR dt "${t1} - ${t0}")
    message("-- ${ARGV0} (${dt} s)")
    if (NOT rc EQUAL 0)
        message("${out}\n${err}")
        message(FATAL_ERROR "${ARGV0} failed (exit ${rc})")
    endif()
    set(step_out "${out}" PARENT_SCOPE)
    set(step_err "${err}" PARENT_SCOPE)
endfunction()

cmake_host_system_information(RESULT n_cpu QUERY NUMBER_OF_LOGICAL_CORES)
find_program(CCACHE_PROGRAM ccache)
set(configure_args -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if (MAKE_PROGRAM)
    list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()
if (BUILD_TYPE)
    list(APPEND configure_args -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
else()
    list(APPEND configure_args -DCMAKE_BUILD_TYPE=Release)
endif()
if (CCACHE_PROGRAM)
    list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE_PROGRAM} -DCMAKE_C_COMPILER_LAUNCHER=${CCACHE_PROGRAM})
endif()
set(consumer_src "${SOURCE_DIR}/tests/install/consumer")

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

if (MODE STREQUAL "installed")
    set(prefix "${WORK_DIR}/prefix")
    step("cmake --install ${BUILD_DIR} --prefix ${prefix}" COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
    foreach (f lib/cmake/ecokv/ecokv-config.cmake lib/cmake/ecokv/ecokv-config-version.cmake include/ecokv/ecokv.h
               include/ecokv/metrics.h)
        if (NOT EXISTS "${prefix}/${f}")
            message(FATAL_ERROR "not installed: ${prefix}/${f}")
        endif()
    endforeach()
    if (LLAMA)  # the adapter holds no evaluation code: that is ecokv::llama-eval's (datasets, metrics, tokenizers)
        find_program(NM_PROGRAM nm REQUIRED)
        step("nm libecokv-llama.a" COMMAND ${NM_PROGRAM} -C --defined-only "${prefix}/lib/libecokv-llama.a")
        string(REGEX MATCHALL "[^\n]*(eval_engine|make_eval_engine|run_eval|load_dataset|ecokv::metrics)[^\n]*"
               eval_symbols "${step_out}")
        if (eval_symbols)
            message(FATAL_ERROR "libecokv-llama.a defines evaluation symbols:\n${eval_symbols}")
        endif()
        foreach (f lib/libecokv-llama-eval.a include/ecokv/llama-eval.h include/ecokv/llama-options.h)
            if (NOT EXISTS "${prefix}/${f}")
                message(FATAL_ERROR "not installed: ${prefix}/${f}")
            endif()
        endforeach()
    endif()
    step("configure the consumer (find_package, CONSUMER_LLAMA=${LLAMA})" COMMAND ${CMAKE_COMMAND}
         -S "${consumer_src}" -B "${WORK_DIR}/consumer" ${configure_args}
         "-DCMAKE_PREFIX_PATH=${prefix}" -DCONSUMER_LLAMA=${LLAMA})
    step("build the consumer" COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/consumer" --parallel ${n_cpu})
    step("run the consumer" COMMAND "${WORK_DIR}/consumer/consumer")
    message("${step_out}")

    if (LLAMA AND CLI)
        # Relocated: nothing may refer to the install path any more (nor to this build or the source models).
        set(moved "${WORK_DIR}/moved-prefix")
        file(RENAME "${prefix}" "${moved}")
        set(models "${moved}/share/ecokv/models")
        foreach (f tiny-vlm.gguf tiny-vlm-mmproj.gguf tiny-vlm-sample.png stories260K.gguf tiny-qwen2vl.gguf
                   tiny-qwen2vl-mmproj.gguf tiny-qwen2vl-sample/items.jsonl tiny-qwen2vl-sample/images/qa-240014.png)
            if (NOT EXISTS "${models}/${f}")
                message(FATAL_ERROR "not installed: ${models}/${f}")
            endif()
        endforeach()
        step("moved prefix: bin/ecokv run --json -n 2 (bundled model)" COMMAND
             ${CMAKE_COMMAND} -E env --unset=ECOKV_MODELS_DIR --unset=LD_LIBRARY_PATH
             "${moved}/bin/ecokv" run --json -n 2)
        string(JSON prompt_tokens ERROR_VARIABLE json_error GET "${step_out}" prompt_tokens)
        string(JSON image_tokens ERROR_VARIABLE json_error2 GET "${step_out}" image_tokens)
        if (json_error OR json_error2 OR NOT image_tokens GREATER 0)
            message(FATAL_ERROR "ecokv run --json: unexpected output\n${step_out}\n${step_err}")
        endif()
        message("   prompt_tokens ${prompt_tokens}, image_tokens ${image_tokens}")
        # Which models did it read? Without the projector in the moved prefix, the error names the file it wanted.
        file(REMOVE "${models}/tiny-qwen2vl-mmproj.gguf")
        execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=ECOKV_MODELS_DIR --unset=LD_LIBRARY_PATH
                                "${moved}/bin/ecokv" run --json -n 2
                        RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
        string(FIND "${err}" "${models}/tiny-qwen2vl-mmproj.gguf" at)
        if (rc EQUAL 0 OR at EQUAL -1)
            message(FATAL_ERROR "ecokv run from ${moved} did not use ${models} (exit ${rc}):\n${out}\n${err}")
        endif()
        message("-- it used ${models}: ${err}")
    endif()

elseif (MODE STREQUAL "subdir")
    # As a subproject ecokv builds only its libraries (tools, tests, bench off by default); eval on, llama off.
    step("configure the consumer (add_subdirectory, ECOKV_LLAMA=OFF)" COMMAND ${CMAKE_COMMAND}
         -S "${consumer_src}" -B "${WORK_DIR}/consumer" ${configure_args}
         "-DECOKV_SOURCE_DIR=${SOURCE_DIR}" -DCONSUMER_LLAMA=OFF)
    step("build the consumer and ecokv" COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/consumer" --parallel ${n_cpu})
    step("run the consumer" COMMAND "${WORK_DIR}/consumer/consumer")
    message("${step_out}")
else()
    message(FATAL_ERROR "run.cmake: MODE must be installed or subdir, not '${MODE}'")
endif()
