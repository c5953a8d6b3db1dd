// The engine tests run with the same OpenMP/OpenBLAS settings as the dflash tool.
#include <gtest/gtest.h>

#include "util/runtime_env.h"

int main(int argc, char** argv) {
  dflash::reexec_with_runtime_env(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
