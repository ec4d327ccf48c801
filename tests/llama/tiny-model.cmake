# ecokv-tiny-model: random-weight llama.cpp models built in memory (tiny-model.*, tiny-mmproj.*, seeded-random.h).
# The tests' fixtures and bench-decode's model builder, so it is declared wherever either is built: included by
# tests/CMakeLists.txt and bench/CMakeLists.txt (ECOKV_BUILD_TESTS and ECOKV_BUILD_BENCH are independent), once.
include_guard(GLOBAL)
find_package(Threads REQUIRED)
add_library(ecokv-tiny-model STATIC ${CMAKE_CURRENT_LIST_DIR}/tiny-model.cpp ${CMAKE_CURRENT_LIST_DIR}/tiny-mmproj.cpp)
target_compile_features(ecokv-tiny-model PUBLIC cxx_std_20)
target_link_libraries(ecokv-tiny-model PUBLIC llama mtmd ggml PRIVATE ggml-cpu Threads::Threads)
target_include_directories(ecokv-tiny-model PUBLIC ${CMAKE_CURRENT_LIST_DIR})
