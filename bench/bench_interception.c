/*
 * Per-call cost and start-up time of CUDA driver calls, with or without the gpushare
 * interception library preloaded. Built and run by bench/bench_interception.py; the mock driver
 * stands in for libcuda.so.1 (LD_LIBRARY_PATH=native/build/mock, GPUSHARE_MOCK_CONFIG).
 *
 * Every driver function is found the way the CUDA runtime finds it: dlopen("libcuda.so.1"),
 * dlsym(handle, "cuGetProcAddress_v2"), then cuGetProcAddress_v2(name, &fn, 12080, 0, &status).
 *
 *   bench_interception calls BATCHES CALLS
 *       One warm-up batch, then BATCHES timed batches of CALLS calls each, of
 *       cuLaunchKernel (params[0] -> 0 µs kernel), cuMemAlloc_v2 + cuMemFree_v2 pairs (1 MiB)
 *       and cuMemGetInfo_v2, in a primary context on device 0. Prints, per case:
 *         case=NAME median_ns=.. min_ns=.. max_ns=..     (per call, or per alloc+free pair)
 *       and before that, where each resolved function lives and what cuMemGetInfo_v2 reports:
 *         resolved=NAME object=PATH
 *         mem_total=BYTES
 *   bench_interception startup N
 *       Forks and execs N copies of itself ("child") at once and waits for them. Prints
 *         startup_ns=..   time from before the first fork to the last child's first successful
 *                         cuMemAlloc_v2 (CLOCK_MONOTONIC, shared by all processes)
 *         child_ns=..     the same for each child (N lines, in completion order)
 *   bench_interception child FD
 *       cuInit, primary context, cuMemAlloc_v2(1 MiB); writes the CLOCK_MONOTONIC time of the
 *       successful allocation to FD as 8 bytes, then exits.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpushare/driver_types.h"

#define CUDA_VERSION_ASKED 12080
#define ALLOC_BYTES (1024u * 1024u)

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                 CUdriverProcAddressQueryResult *);
typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*set_current_fn)(CUcontext);
typedef CUresult (*mem_get_info_fn)(size_t *, size_t *);
typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*mem_free_fn)(CUdeviceptr);
typedef CUresult (*launch_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                              unsigned int, unsigned int, unsigned int, CUstream, void **,
                              void **);

static struct {
    get_proc_fn get_proc;
    init_fn init;
    device_get_fn device_get;
    retain_fn primary_retain;
    set_current_fn set_current;
    mem_get_info_fn mem_get_info;
    mem_alloc_fn mem_alloc;
    mem_free_fn mem_free;
    launch_fn launch;
} cu;

static void die(const char *what, int rc) {
    fprintf(stderr, "bench_interception: %s failed (%d)\n", what, rc);
    exit(1);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        die("clock_gettime", errno);
    }
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *resolve(const char *name, int print) {
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc = cu.get_proc(name, &fn, CUDA_VERSION_ASKED, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (rc != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || fn == NULL) {
        fprintf(stderr, "bench_interception: cuGetProcAddress_v2(%s) = %d, status %d\n", name,
                rc, (int)status);
        exit(1);
    }
    if (print) {
        Dl_info info;
        memset(&info, 0, sizeof info);
        const char *object = dladdr(fn, &info) != 0 && info.dli_fname ? info.dli_fname : "?";
        printf("resolved=%s object=%s\n", name, object);
    }
    return fn;
}

#define RESOLVE(field, name, print)                                                              \
    do {                                                                                         \
        void *p_ = resolve(name, print);                                                         \
        memcpy(&cu.field, &p_, sizeof cu.field);                                                 \
    } while (0)

/* What the runtime does first: load the driver, find cuGetProcAddress, resolve through it. */
static void load_driver(int print) {
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (handle == NULL) {
        fprintf(stderr, "bench_interception: dlopen(libcuda.so.1): %s\n", dlerror());
        exit(1);
    }
    void *get_proc = dlsym(handle, "cuGetProcAddress_v2");
    if (get_proc == NULL) {
        fprintf(stderr, "bench_interception: dlsym(cuGetProcAddress_v2): %s\n", dlerror());
        exit(1);
    }
    memcpy(&cu.get_proc, &get_proc, sizeof cu.get_proc);
    RESOLVE(get_proc, "cuGetProcAddress", 0); /* the runtime re-resolves it through itself */
    RESOLVE(init, "cuInit", 0);
    RESOLVE(device_get, "cuDeviceGet", 0);
    RESOLVE(primary_retain, "cuDevicePrimaryCtxRetain", 0);
    RESOLVE(set_current, "cuCtxSetCurrent", 0);
    RESOLVE(mem_get_info, "cuMemGetInfo", print);
    RESOLVE(mem_alloc, "cuMemAlloc", print);
    RESOLVE(mem_free, "cuMemFree", print);
    RESOLVE(launch, "cuLaunchKernel", print);
}

static void primary_context(void) {
    CUdevice device;
    CUcontext context;
    CUresult rc;
    if ((rc = cu.init(0)) != CUDA_SUCCESS) {
        die("cuInit", rc);
    }
    if ((rc = cu.device_get(&device, 0)) != CUDA_SUCCESS) {
        die("cuDeviceGet", rc);
    }
    if ((rc = cu.primary_retain(&context, device)) != CUDA_SUCCESS) {
        die("cuDevicePrimaryCtxRetain", rc);
    }
    if ((rc = cu.set_current(context)) != CUDA_SUCCESS) {
        die("cuCtxSetCurrent", rc);
    }
}

/* ---- per-call cost ----------------------------------------------------------------------- */

enum bench_case { CASE_LAUNCH, CASE_ALLOC_FREE, CASE_MEM_GET_INFO };

static unsigned int g_kernel_us = 0; /* the mock runs a kernel for *params[0] µs */

/* One batch of `calls` calls; returns the wall time of the batch in ns. */
static uint64_t run_batch(enum bench_case which, long calls) {
    CUfunction function = (CUfunction)0x1000; /* the mock accepts any non-null function */
    void *params[] = {&g_kernel_us};
    CUdeviceptr pointer = 0;
    size_t free_bytes = 0, total_bytes = 0;
    CUresult rc = CUDA_SUCCESS;
    uint64_t start = now_ns();
    switch (which) {
    case CASE_LAUNCH:
        for (long i = 0; i < calls && rc == CUDA_SUCCESS; i++) {
            rc = cu.launch(function, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
        }
        break;
    case CASE_ALLOC_FREE:
        for (long i = 0; i < calls && rc == CUDA_SUCCESS; i++) {
            rc = cu.mem_alloc(&pointer, ALLOC_BYTES);
            if (rc == CUDA_SUCCESS) {
                rc = cu.mem_free(pointer);
            }
        }
        break;
    case CASE_MEM_GET_INFO:
        for (long i = 0; i < calls && rc == CUDA_SUCCESS; i++) {
            rc = cu.mem_get_info(&free_bytes, &total_bytes);
        }
        break;
    }
    uint64_t elapsed = now_ns() - start;
    if (rc != CUDA_SUCCESS) {
        die("a benchmarked call", rc);
    }
    return elapsed;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void bench_case(const char *name, enum bench_case which, int batches, long calls) {
    double *per_call = calloc((size_t)batches, sizeof *per_call);
    if (per_call == NULL) {
        die("calloc", errno);
    }
    (void)run_batch(which, calls); /* warm-up */
    for (int b = 0; b < batches; b++) {
        per_call[b] = (double)run_batch(which, calls) / (double)calls;
    }
    qsort(per_call, (size_t)batches, sizeof *per_call, compare_double);
    double median = batches % 2 ? per_call[batches / 2]
                                : (per_call[batches / 2 - 1] + per_call[batches / 2]) / 2;
    printf("case=%s median_ns=%.2f min_ns=%.2f max_ns=%.2f\n", name, median, per_call[0],
           per_call[batches - 1]);
    fflush(stdout);
    free(per_call);
}

static int cmd_calls(int batches, long calls) {
    load_driver(1);
    primary_context();
    size_t free_bytes = 0, total_bytes = 0;
    CUresult rc = cu.mem_get_info(&free_bytes, &total_bytes);
    if (rc != CUDA_SUCCESS) {
        die("cuMemGetInfo_v2", rc);
    }
    printf("mem_total=%zu\n", total_bytes);
    fflush(stdout);
    bench_case("launch", CASE_LAUNCH, batches, calls);
    bench_case("alloc_free", CASE_ALLOC_FREE, batches, calls);
    bench_case("mem_get_info", CASE_MEM_GET_INFO, batches, calls);
    return 0;
}

/* ---- start-up ---------------------------------------------------------------------------- */

static int cmd_child(int fd) {
    load_driver(0);
    primary_context();
    CUdeviceptr pointer = 0;
    CUresult rc = cu.mem_alloc(&pointer, ALLOC_BYTES);
    if (rc != CUDA_SUCCESS) {
        die("cuMemAlloc_v2", rc);
    }
    uint64_t done = now_ns();
    if (write(fd, &done, sizeof done) != (ssize_t)sizeof done) {
        die("write", errno);
    }
    return 0;
}

static int cmd_startup(const char *self, int count) {
    int fds[2];
    if (pipe(fds) != 0) {
        die("pipe", errno);
    }
    char fd_text[16];
    snprintf(fd_text, sizeof fd_text, "%d", fds[1]);
    uint64_t start = now_ns();
    for (int i = 0; i < count; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            die("fork", errno);
        }
        if (pid == 0) {
            close(fds[0]);
            execl(self, self, "child", fd_text, (char *)NULL);
            _exit(127);
        }
    }
    close(fds[1]);
    uint64_t last = 0, done = 0;
    int reported = 0;
    ssize_t got;
    while ((got = read(fds[0], &done, sizeof done)) == (ssize_t)sizeof done) {
        printf("child_ns=%llu\n", (unsigned long long)(done - start));
        last = done > last ? done : last;
        reported++;
    }
    int failed = 0;
    for (int i = 0; i < count; i++) {
        int status = 0;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            failed++;
        }
    }
    if (failed || reported != count) {
        fprintf(stderr, "bench_interception: %d of %d children reported, %d failed\n", reported,
                count, failed);
        return 1;
    }
    printf("startup_ns=%llu\n", (unsigned long long)(last - start));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "calls") == 0 && atoi(argv[2]) > 0 && atol(argv[3]) > 0) {
        return cmd_calls(atoi(argv[2]), atol(argv[3]));
    }
    if (argc == 3 && strcmp(argv[1], "startup") == 0 && atoi(argv[2]) > 0) {
        return cmd_startup("/proc/self/exe", atoi(argv[2]));
    }
    if (argc == 3 && strcmp(argv[1], "child") == 0) {
        return cmd_child(atoi(argv[2]));
    }
    fprintf(stderr,
            "usage: %s calls BATCHES CALLS | startup N | child FD\n"
            "  (run by bench/bench_interception.py)\n",
            argv[0]);
    return 2;
}
