/*
 * intercept_graph MILLISECONDS KERNEL_US GRAPH_KERNELS PATTERN: launch work for MILLISECONDS of
 * wall time, synchronising every 4 launches, and print the share of GPU time it got over the
 * whole run and over its second half, and (second half) while graphs / kernels were launched:
 *   launches= share_percent= late_share_percent= late_graph_share_percent=
 *   late_kernel_share_percent=
 * The mock runs a single kernel for *params[0] = KERNEL_US microseconds and a graph launch as
 * GRAPH_KERNELS kernels of the device's kernel_time_us (the test sets that to KERNEL_US too).
 * PATTERN: "graph" (graph launches only, alternating cuGraphLaunch and cuGraphLaunch_ptsz),
 * "alt" (one kernel, one graph, ...), "phases" (400 ms of graph launches, 400 ms of kernels,
 * ...; synchronising after every launch, so that each interval between synchronisations
 * belongs to one kind).
 */
#include <string.h>
#include <time.h>

#include "intercept_util.h"

static double now_s(void) {
    struct timespec ts;
    EXPECT(clock_gettime(CLOCK_MONOTONIC, &ts) == 0);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        return 2;
    }
    double duration = atof(argv[1]) / 1000.0;
    unsigned int kernel_us = (unsigned int)atoi(argv[2]);
    unsigned int graph_kernels = (unsigned int)atoi(argv[3]);
    const char *pattern = argv[4];
    EXPECT(strcmp(pattern, "graph") == 0 || strcmp(pattern, "alt") == 0 ||
           strcmp(pattern, "phases") == 0);
    CUcontext context = test_context();
    CUgraph graph;
    CUgraphExec exec;
    EXPECT_RC(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
    EXPECT_RC(gpushareMockGraphSetKernelCount(graph, graph_kernels), CUDA_SUCCESS);
    EXPECT_RC(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
    CUfunction function = (CUfunction)0x1000; /* the mock accepts any non-null function */
    void *params[] = {&kernel_us};
    double start = now_s(), half = start + duration / 2;
    long launches = 0;
    double busy_us = 0, late_busy_us = 0, pending_us = 0, late_start = 0;
    double kind_busy_us[2] = {0, 0}, kind_wall_s[2] = {0, 0}, last_sync = start;
    int sync_every = pattern[0] == 'p' ? 1 : 4, kind = 0;
    for (;;) {
        double t = now_s();
        if (t - start >= duration) {
            break;
        }
        int use_graph;
        if (pattern[0] == 'g') {
            use_graph = 1;
        } else if (pattern[0] == 'a') {
            use_graph = launches % 2 == 1;
        } else {
            use_graph = ((long)((t - start) / 0.400)) % 2 == 0;
        }
        if (use_graph) {
            CUresult rc = launches % 2 == 0 ? cuGraphLaunch(exec, NULL)
                                            : cuGraphLaunch_ptsz(exec, NULL);
            EXPECT_RC(rc, CUDA_SUCCESS);
            pending_us += (double)graph_kernels * kernel_us;
        } else {
            EXPECT_RC(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL),
                      CUDA_SUCCESS);
            pending_us += kernel_us;
        }
        kind |= use_graph ? 1 : 2; /* 3: both kinds since the last synchronisation */
        launches++;
        if (launches % sync_every == 0) {
            EXPECT_RC(cuCtxSynchronize(), CUDA_SUCCESS);
            busy_us += pending_us;
            double after = now_s();
            if (after >= half) {
                if (late_start == 0) {
                    late_start = after;
                } else {
                    late_busy_us += pending_us;
                    if (kind != 3) {
                        kind_busy_us[kind - 1] += pending_us;
                        kind_wall_s[kind - 1] += after - last_sync;
                    }
                }
            }
            last_sync = after;
            pending_us = 0;
            kind = 0;
        }
    }
    EXPECT_RC(cuCtxSynchronize(), CUDA_SUCCESS);
    busy_us += pending_us;
    double end = now_s();
    printf("launches=%ld\nshare_percent=%.1f\nlate_share_percent=%.1f\n", launches,
           100.0 * busy_us / 1e6 / (end - start),
           late_start > 0 ? 100.0 * late_busy_us / 1e6 / (end - late_start) : 0.0);
    for (int k = 0; k < 2; k++) {
        printf("late_%s_share_percent=%.1f\n", k == 0 ? "graph" : "kernel",
               kind_wall_s[k] > 0 ? 100.0 * kind_busy_us[k] / 1e6 / kind_wall_s[k] : 0.0);
    }
    EXPECT_RC(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT_RC(cuGraphDestroy(graph), CUDA_SUCCESS);
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return 0;
}
