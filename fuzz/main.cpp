// libFuzzer entry point of one fuzz target: fuzz/CMakeLists.txt compiles this file once per
// target with CKPT_FUZZ_FUNCTION naming its body in targets.cpp (pickle_target, ...).
#include <cstddef>
#include <cstdint>

#include "targets.h"

#ifndef CKPT_FUZZ_FUNCTION
#error "CKPT_FUZZ_FUNCTION must name a function of fuzz/targets.h"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ckpt::fuzz::CKPT_FUZZ_FUNCTION(data, size);
}
