# The scheduler and cache manager stay pure C++: no CUDA, no backend, no model. Run as a test (ctest) so a change
# that pulls one of them in fails CI. Usage: cmake -DSOURCE_DIR=<repo> -P check_pure_scheduler.cmake
file(GLOB files "${SOURCE_DIR}/csrc/engine/request.*" "${SOURCE_DIR}/csrc/engine/cache_manager.*"
     "${SOURCE_DIR}/csrc/engine/scheduler.*" "${SOURCE_DIR}/csrc/engine/sampling_params.*")
list(LENGTH files count)
if(count LESS 8)
  message(FATAL_ERROR "expected the scheduler's sources under csrc/engine, found ${count} files")
endif()
foreach(f ${files})
  file(STRINGS "${f}" includes REGEX "^[ \t]*#[ \t]*include")
  foreach(line ${includes})
    if(line MATCHES "cuda|cublas|nccl|backend/|model/|nanobind")
      message(FATAL_ERROR "${f} must stay pure C++ but has: ${line}")
    endif()
  endforeach()
endforeach()
message(STATUS "scheduler sources are pure C++ (${count} files)")
