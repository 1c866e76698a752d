/* What the hardware profile's field table (sim/hw.c) offers the rest of the library: writing a
 * profile's figures as the reader reads them, and comparing two profiles figure by figure. Both
 * walk the one table the reader checks, so a field added there is written and compared without
 * another list to keep in step. Internal to libferry (and its tests). */
#ifndef FERRY_SIM_HW_INTERNAL_H
#define FERRY_SIM_HW_INTERNAL_H

#include "common/json.h"
#include "ferry/hw.h"

/* Add to `root` every section the profile has and every figure of them, in the reader's format:
 * a figure that is 0 and has no default is "not given" and left out (the reader reads an absent
 * figure as 0), a 0 the reader refuses (a rate that must be positive) is never written, a 0 of a
 * figure with a default is written (absent, it would read back as the default), and a fitted cost
 * kind keeps all its parts. A profile the reader read comes back with the same figures
 * (ferry__hw_first_difference() finds none); one built in memory must hold the defaults it
 * means (ferry_calibrate_probe() sets host.cpu_op_ns). */
ferry_status ferry__hw_figures_to_json(cJSON *root, const struct ferry_hw_profile *p);

/* The path of the first figure ("host.core_gflops.amx_int8", "runtime", "cost.matmul") in which
 * two profiles differ, or NULL when every section's presence and every figure of the sections
 * and cost kinds they have agree. Numbers compare exactly (a written profile reads back
 * exactly); names compare as strings. */
const char *ferry__hw_first_difference(const struct ferry_hw_profile *a, const struct ferry_hw_profile *b);

/* Shared memory one SM of a GPU of this CUDA compute capability offers thread blocks at most, and
 * what the driver reserves of it per block (the CUDA C++ Programming Guide's per-capability
 * table; the same capabilities as ferry_hw_gpu_residency()). 0 and both figures, or -1 (outputs
 * untouched). */
int ferry__hw_gpu_shared_memory(double compute_capability, int64_t *per_sm_bytes, int64_t *reserved_per_block_bytes);

#endif
