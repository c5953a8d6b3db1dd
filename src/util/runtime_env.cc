#include "util/runtime_env.h"

#include <unistd.h>

#include <cstdlib>

namespace dflash {

void reexec_with_runtime_env(char** argv) {
  if (std::getenv("DFLASH_RUNTIME_ENV")) return;  // already re-executed (or opted out)
  setenv("DFLASH_RUNTIME_ENV", "1", 1);
  if (!std::getenv("OMP_WAIT_POLICY")) setenv("GOMP_SPINCOUNT", "100000", 0);
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    setenv("OPENBLAS_CORETYPE", "Haswell", 0);
#endif
  execv("/proc/self/exe", argv);  // returns only on failure: then run with what we have
}

}  // namespace dflash
