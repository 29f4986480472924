// doctest for files that also include LibTorch: c10/util/Logging.h defines glog-style CHECK
// macros, and doctest's must win. Include after the LibTorch headers.
#pragma once

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LE
#undef CHECK_LT
#undef CHECK_GE
#undef CHECK_GT
#include <doctest/doctest.h>
