#pragma once
// Settings that OpenMP and OpenBLAS read only when they load, before main() runs:
//  - GOMP_SPINCOUNT: a forward pass runs dozens of short parallel regions back to back;
//    threads that sleep at once (OMP_WAIT_POLICY=passive) pay a futex wake-up for each, five
//    times the work itself on a small model, while threads that spin forever (active) starve
//    whatever shares the cores. A bounded spin keeps the pool hot inside a pass and idle
//    between requests;
//  - OPENBLAS_CORETYPE: OpenBLAS 0.3.21 does not recognise some current Xeons (virtualised
//    ones report a generic model) and falls back to its Prescott (SSE3) kernels, several times
//    slower than the AVX-512 or AVX2 kernels the CPU runs.
// Programs call this first thing in main(); when something is missing it sets it and
// re-executes itself once. A user's own settings are kept.
namespace dflash {
void reexec_with_runtime_env(char** argv);
}
