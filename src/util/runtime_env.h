#pragma once
// Settings that OpenMP and OpenBLAS read only when they load, before main() runs:
//  - OMP_WAIT_POLICY=passive: spinning idle threads starve whatever shares the cores;
//  - OPENBLAS_CORETYPE: OpenBLAS 0.3.21 does not recognise some current Xeons (virtualised
//    ones report a generic model) and falls back to its Prescott (SSE3) kernels, several times
//    slower than the AVX-512 or AVX2 kernels the CPU runs.
// Programs call this first thing in main(); when something is missing it sets it and
// re-executes itself once. A user's own settings are kept.
namespace dflash {
void reexec_with_runtime_env(char** argv);
}
