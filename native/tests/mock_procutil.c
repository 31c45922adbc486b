/*
 * nvmlDeviceGetProcessUtilization in the mock (per-process SM utilisation from the timeline).
 *
 * mock_procutil api           the call's contract in one process (errors, the size query,
 *                             NOT_FOUND, a sample's fields); prints key=value lines, failures=N
 * mock_procutil split A B     a forked child queues an A-microsecond kernel on device 0, this
 *                             process queues a B-microsecond one right behind it (back to back);
 *                             prints each one's smUtil over the period since before the fork
 * mock_procutil query DEVICE SINCE_US
 *                             prints rc, samples and pids=PID:SMUTIL:TIMESTAMP,... for DEVICE
 * mock_procutil hold DEVICE MIB
 *                             a context and MIB MiB on DEVICE; prints "ready pid=N"; then for
 *                             each stdin line "run US" queues a kernel of US microseconds,
 *                             synchronises and prints "ran"; releases at EOF or any other line
 */
#include "gpushare/driver_types.h"
#include "mock_check.h"

#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static unsigned long long realtime_us(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0)
        return 0;
    return (unsigned long long)now.tv_sec * 1000000ull + (unsigned long long)now.tv_nsec / 1000;
}

static double monotonic_ms(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
        return 0;
    return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}

/* A kernel of `micros` microseconds on the current context's null stream. */
static void launch_us(unsigned int micros)
{
    void *params[] = {&micros};
    EXPECT(cuLaunchKernel((CUfunction)0x1, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
           CUDA_SUCCESS);
}

/* The samples newer than `since` into out (up to max); the return code; *count the number. */
static nvmlReturn_t query(nvmlDevice_t device, unsigned long long since,
                          nvmlProcessUtilizationSample_t *out, unsigned int max,
                          unsigned int *count)
{
    *count = 0;
    nvmlReturn_t rc = nvmlDeviceGetProcessUtilization(device, NULL, count, since);
    if (rc != NVML_ERROR_INSUFFICIENT_SIZE)
        return rc;
    if (*count > max)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    *count = max;
    return nvmlDeviceGetProcessUtilization(device, out, count, since);
}

static int run_api(void)
{
    nvmlDevice_t device = NULL, other = NULL;
    nvmlProcessUtilizationSample_t samples[4];
    unsigned int count = 7;
    EXPECT(nvmlDeviceGetProcessUtilization(NULL, NULL, &count, 0), NVML_ERROR_UNINITIALIZED);
    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetHandleByIndex_v2(1, &other), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetProcessUtilization(device, NULL, NULL, 0), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT(nvmlDeviceGetProcessUtilization((nvmlDevice_t)&count, NULL, &count, 0),
           NVML_ERROR_INVALID_ARGUMENT);
    /* Nothing ran yet: NOT_FOUND, the count cleared. */
    count = 7;
    EXPECT(nvmlDeviceGetProcessUtilization(device, NULL, &count, 0), NVML_ERROR_NOT_FOUND);
    EXPECT(count, 0);

    CUcontext context = NULL;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuCtxCreate_v2(&context, 0, 0), CUDA_SUCCESS);
    if (mock_failures)
        return 1;
    unsigned long long before = realtime_us();
    launch_us(50000);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);

    /* The size query: a NULL buffer, or one too small, is INSUFFICIENT_SIZE with the count. */
    count = 0;
    EXPECT(nvmlDeviceGetProcessUtilization(device, NULL, &count, before),
           NVML_ERROR_INSUFFICIENT_SIZE);
    KV("size_query_count", "%u", count);
    count = 0;
    EXPECT(nvmlDeviceGetProcessUtilization(device, samples, &count, before),
           NVML_ERROR_INSUFFICIENT_SIZE);
    KV("small_buffer_count", "%u", count);

    memset(samples, 0xff, sizeof samples);
    count = 4;
    EXPECT(nvmlDeviceGetProcessUtilization(device, samples, &count, before), NVML_SUCCESS);
    unsigned long long after = realtime_us();
    KV("samples", "%u", count);
    if (count != 1)
        return 1;
    KV("pid_is_self", "%d", samples[0].pid == (unsigned int)getpid());
    KV("sm_util", "%u", samples[0].smUtil);
    KV("mem_enc_dec", "%u", samples[0].memUtil + samples[0].encUtil + samples[0].decUtil);
    KV("timestamp_in_call", "%d", samples[0].timeStamp >= before && samples[0].timeStamp <= after);
    KV("period_us", "%llu", samples[0].timeStamp - before); /* what smUtil is a share of */
    /* Since that sample nothing ran: NOT_FOUND. Neither in the future nor on the other device. */
    count = 4;
    KV("after_last_seen_rc", "%d",
       nvmlDeviceGetProcessUtilization(device, samples, &count, samples[0].timeStamp));
    KV("after_last_seen_count", "%u", count);
    count = 4;
    KV("future_rc", "%d",
       nvmlDeviceGetProcessUtilization(device, samples, &count, after + 60000000ull));
    count = 4;
    KV("other_device_rc", "%d", nvmlDeviceGetProcessUtilization(other, samples, &count, 0));
    /* lastSeenTimeStamp 0: the driver's whole window (utilization_window_ms). */
    unsigned int whole = 0;
    EXPECT(query(device, 0, samples, 4, &whole), NVML_SUCCESS);
    KV("since_zero_samples", "%u", whole);
    KV("since_zero_sm_util", "%u", whole == 1 ? samples[0].smUtil : 999u);
    nvmlUtilization_t rates = {0};
    EXPECT(nvmlDeviceGetUtilizationRates(device, &rates), NVML_SUCCESS);
    KV("device_util", "%u", rates.gpu);
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    KV("failures", "%d", mock_failures);
    return mock_failures == 0 ? 0 : 1;
}

static int run_split(unsigned int child_us, unsigned int parent_us)
{
    int ready[2];
    if (pipe(ready) != 0) {
        perror("pipe");
        return 1;
    }
    unsigned long long since = realtime_us();
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        CUcontext context = NULL;
        (void)close(ready[0]);
        EXPECT(cuInit(0), CUDA_SUCCESS);
        EXPECT(cuCtxCreate_v2(&context, 0, 0), CUDA_SUCCESS);
        launch_us(child_us);
        char byte = 'q';
        EXPECT(write(ready[1], &byte, 1), 1);
        (void)close(ready[1]);
        EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
        EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
        _exit(mock_failures == 0 ? 0 : 1);
    }
    (void)close(ready[1]);
    char byte = 0;
    EXPECT(read(ready[0], &byte, 1), 1); /* the child's kernel is queued */
    (void)close(ready[0]);
    CUcontext context = NULL;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuCtxCreate_v2(&context, 0, 0), CUDA_SUCCESS);
    double start = monotonic_ms();
    launch_us(parent_us);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    KV("parent_wait_ms", "%.1f", monotonic_ms() - start);
    int status = 0;
    EXPECT(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    nvmlDevice_t device = NULL;
    EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_SUCCESS);
    nvmlProcessUtilizationSample_t samples[8];
    unsigned int count = 0;
    EXPECT(query(device, since, samples, 8, &count), NVML_SUCCESS);
    KV("samples", "%u", count);
    for (unsigned int k = 0; k < count; k++) {
        if (samples[k].pid == (unsigned int)child)
            KV("child_util", "%u", samples[k].smUtil);
        else if (samples[k].pid == (unsigned int)getpid())
            KV("parent_util", "%u", samples[k].smUtil);
        else
            KV("stranger_pid", "%u", samples[k].pid);
    }
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    KV("failures", "%d", mock_failures);
    return mock_failures == 0 ? 0 : 1;
}

static int run_query(unsigned int index, unsigned long long since)
{
    nvmlDevice_t device = NULL;
    nvmlProcessUtilizationSample_t samples[64];
    unsigned int count = 0;
    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetHandleByIndex_v2(index, &device), NVML_SUCCESS);
    if (mock_failures)
        return 1;
    KV("rc", "%d", query(device, since, samples, 64, &count));
    KV("samples", "%u", count);
    printf("pids=");
    for (unsigned int k = 0; k < count; k++)
        printf("%s%u:%u:%llu", k ? "," : "", samples[k].pid, samples[k].smUtil,
               samples[k].timeStamp);
    printf("\n");
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    return mock_failures == 0 ? 0 : 1;
}

static int run_hold(int index, unsigned long long mib)
{
    CUcontext context = NULL;
    CUdeviceptr pointer = 0;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuCtxCreate_v2(&context, 0, index), CUDA_SUCCESS);
    if (mib > 0)
        EXPECT(cuMemAlloc_v2(&pointer, mib * MIB), CUDA_SUCCESS);
    if (mock_failures)
        return 1;
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    unsigned int micros = 0;
    while (fgets(line, sizeof line, stdin) && sscanf(line, "run %u", &micros) == 1) {
        launch_us(micros);
        EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
        printf("ran\n");
        fflush(stdout);
    }
    if (mib > 0)
        EXPECT(cuMemFree_v2(pointer), CUDA_SUCCESS);
    EXPECT(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return mock_failures == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "api") == 0)
        return run_api();
    if (argc >= 4 && strcmp(argv[1], "split") == 0)
        return run_split((unsigned int)strtoul(argv[2], NULL, 10),
                         (unsigned int)strtoul(argv[3], NULL, 10));
    if (argc >= 4 && strcmp(argv[1], "query") == 0)
        return run_query((unsigned int)strtoul(argv[2], NULL, 10),
                         strtoull(argv[3], NULL, 10));
    if (argc >= 4 && strcmp(argv[1], "hold") == 0)
        return run_hold(atoi(argv[2]), strtoull(argv[3], NULL, 10));
    fprintf(stderr, "usage: see the comment at the top of mock_procutil.c\n");
    return 2;
}
