/*
 * Mock NVML (libnvidia-ml.so.1). Devices come from the same configuration as the mock driver;
 * memory use, running processes and utilisation are read from the shared state file, so they
 * reflect every process using the mock CUDA driver.
 */
#include "gpushare/driver_types.h"
#include "mock.h"
#include "nvml_internal.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct nvmlDevice_st {
    int index;
};

static pthread_mutex_t g_nvml_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refcount;
static struct nvmlDevice_st g_devices[MOCK_MAX_DEVICES];

static nvmlReturn_t check_init(void)
{
    if (pthread_mutex_lock(&g_nvml_lock) != 0)
        return NVML_ERROR_UNKNOWN;
    unsigned int refcount = g_refcount;
    (void)pthread_mutex_unlock(&g_nvml_lock);
    return refcount > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

/* Initialisation check plus handle validation; the device index through *index. */
static nvmlReturn_t check_device(nvmlDevice_t device, int *index)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    for (int i = 0; i < mock_cfg()->device_count; i++) {
        if (device == &g_devices[i]) {
            *index = i;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t mock_nvml_check_device(nvmlDevice_t device, int *index)
{
    return check_device(device, index);
}

nvmlDevice_t mock_nvml_handle(int index)
{
    return &g_devices[index];
}

nvmlReturn_t mock_nvml_check_init(void)
{
    return check_init();
}

MOCK_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    if (mock_setup("nvml") != 0)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (pthread_mutex_lock(&g_nvml_lock) != 0)
        return NVML_ERROR_UNKNOWN;
    for (int i = 0; i < MOCK_MAX_DEVICES; i++)
        g_devices[i].index = i;
    g_refcount++;
    (void)pthread_mutex_unlock(&g_nvml_lock);
    return NVML_SUCCESS;
}

/* What nvidia-ml-py's nvmlInit() calls; the mock has no flags to honour. */
MOCK_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return nvmlInit_v2();
}

MOCK_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    if (pthread_mutex_lock(&g_nvml_lock) != 0)
        return NVML_ERROR_UNKNOWN;
    nvmlReturn_t rc = NVML_ERROR_UNINITIALIZED;
    if (g_refcount > 0) {
        g_refcount--;
        rc = NVML_SUCCESS;
    }
    (void)pthread_mutex_unlock(&g_nvml_lock);
    return rc;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)mock_cfg()->device_count;
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!device || index >= (unsigned int)mock_cfg()->device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t rc = check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < mock_cfg()->device_count; i++) {
        if (strcmp(mock_cfg()->devices[i].uuid_text, uuid) == 0) {
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    int i = 0;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)i;
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    return nvmlDeviceGetIndex(device, minor); /* /dev/nvidia<index> */
}

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *text)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    int i = 0;
    nvmlReturn_t rc = check_device(device, &i);
    return rc != NVML_SUCCESS ? rc : copy_string(name, length, mock_cfg()->devices[i].name);
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    int i = 0;
    nvmlReturn_t rc = check_device(device, &i);
    return rc != NVML_SUCCESS ? rc : copy_string(uuid, length, mock_cfg()->devices[i].uuid_text);
}

static nvmlReturn_t used_bytes(int index, uint64_t *used)
{
    if (mock_shared_lock() != 0)
        return NVML_ERROR_UNKNOWN;
    *used = mock_device_used_locked(index);
    mock_shared_unlock();
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    int i = 0;
    uint64_t used = 0;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = used_bytes(i, &used)) != NVML_SUCCESS)
        return rc;
    uint64_t total = mock_cfg()->devices[i].memory_bytes;
    memory->total = total;
    memory->used = used < total ? used : total;
    memory->free = total - memory->used;
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    int i = 0;
    uint64_t used = 0;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if ((rc = used_bytes(i, &used)) != NVML_SUCCESS)
        return rc;
    uint64_t total = mock_cfg()->devices[i].memory_bytes;
    memory->total = total;
    memory->reserved = 0; /* the mock reserves nothing for the driver */
    memory->used = used < total ? used : total;
    memory->free = total - memory->used;
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                       nvmlUtilization_t *utilization)
{
    int i = 0;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mock_shared_lock() != 0)
        return NVML_ERROR_UNKNOWN;
    utilization->gpu = mock_utilization_locked(i, mock_now_ns());
    mock_shared_unlock();
    utilization->memory = 0; /* memory-controller load is not modelled */
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int *count,
                                                                 nvmlProcessInfo_t *infos)
{
    int i = 0;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count || (*count > 0 && !infos))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_proc_usage usage[MOCK_MAX_PROCS];
    if (mock_shared_lock() != 0)
        return NVML_ERROR_UNKNOWN;
    unsigned int live = mock_processes_locked(i, usage, MOCK_MAX_PROCS);
    mock_shared_unlock();
    if (live > *count) {
        *count = live;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int k = 0; k < live; k++) {
        infos[k].pid = (unsigned int)usage[k].pid;
        infos[k].usedGpuMemory = usage[k].used_bytes;
        infos[k].gpuInstanceId = 0xFFFFFFFFu; /* not a MIG device */
        infos[k].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = live;
    return NVML_SUCCESS;
}

/*
 * Per-process SM utilisation, from the kernel timeline: the driver "takes a sample" when asked.
 * The period is (lastSeenTimeStamp, now], at most the last utilization_window_ms (what the
 * driver keeps); each process that ran kernels in it gets one sample, timestamped now
 * (CLOCK_REALTIME, microseconds), with smUtil its busy share of the period in percent.
 */
MOCK_EXPORT nvmlReturn_t
nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                unsigned int *processSamplesCount,
                                unsigned long long lastSeenTimeStamp)
{
    int i = 0;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mock_proc_busy *busy = malloc(MOCK_MAX_INTERVALS * sizeof *busy);
    if (!busy)
        return NVML_ERROR_UNKNOWN;
    if (mock_shared_lock() != 0) {
        free(busy);
        return NVML_ERROR_UNKNOWN;
    }
    uint64_t now = mock_now_ns();
    uint64_t real_now = mock_realtime_ns();
    uint64_t window = mock_cfg()->util_window_ns;
    uint64_t low = now > window ? now - window : 0;
    uint64_t real_now_us = real_now / 1000u;
    bool newer = lastSeenTimeStamp < real_now_us;
    if (newer && lastSeenTimeStamp > 0) {
        /* lastSeenTimeStamp on the monotonic clock: now minus how long ago it was. */
        uint64_t ago_us = real_now_us - lastSeenTimeStamp;
        if (ago_us < (now - low) / 1000u)
            low = now - ago_us * 1000u;
    }
    unsigned int processes = newer ? mock_process_busy_locked(i, low, now, busy) : 0;
    mock_shared_unlock();
    if (processes == 0) {
        free(busy);
        *processSamplesCount = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!utilization || *processSamplesCount < processes) {
        free(busy);
        *processSamplesCount = processes;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    uint64_t period = now - low; /* > 0: some process was busy in it */
    for (unsigned int k = 0; k < processes; k++) {
        uint64_t percent = (busy[k].busy_ns * 100u + period / 2) / period;
        utilization[k].pid = (unsigned int)busy[k].pid;
        utilization[k].timeStamp = real_now_us;
        utilization[k].smUtil = percent > 100 ? 100u : (unsigned int)percent;
        utilization[k].memUtil = 0; /* framebuffer, encoder, decoder: not modelled */
        utilization[k].encUtil = 0;
        utilization[k].decUtil = 0;
    }
    *processSamplesCount = processes;
    free(busy);
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                                  nvmlTemperatureSensors_t sensor,
                                                  unsigned int *temperature_c)
{
    int i = 0;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!temperature_c || sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temperature_c = 45;
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power_mw)
{
    int i = 0;
    nvmlReturn_t rc = check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!power_mw)
        return NVML_ERROR_INVALID_ARGUMENT;
    *power_mw = 120000;
    return NVML_SUCCESS;
}

MOCK_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
        return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_TIMEOUT:
        return "Timeout";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST:
        return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument version mismatch";
    default:
        return "Unknown Error";
    }
}
