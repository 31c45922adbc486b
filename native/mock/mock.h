/*
 * Mock CUDA driver and NVML: the configuration and the cross-process state they share.
 *
 * Both libcuda.so.1 and libnvidia-ml.so.1 are built with mock_state.c, so each library has its
 * own copy of what is declared here; they meet in the memory-mapped state file, whose layout is
 * struct mock_shared below (see docs/mock.md).
 */
#ifndef GPUSHARE_MOCK_H
#define GPUSHARE_MOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MOCK_EXPORT __attribute__((visibility("default")))

#define MOCK_MAX_DEVICES 16
#define MOCK_MAX_PROCS 128         /* per-process records per device */
#define MOCK_MAX_INTERVALS 4096    /* busy intervals kept per device (a ring) */
#define MOCK_NAME_LEN 96
#define MOCK_MIB (1024ull * 1024ull)
#define MOCK_MAX_LINKS 18           /* NVML_NVLINK_MAX_LINKS */
#define MOCK_MAX_XIDS 64            /* Xid events kept per device (a ring) */
#define MOCK_DRIVER_VERSION_LEN 80
#define MOCK_DEFAULT_NVML_DRIVER_VERSION "580.65.06"

#define MOCK_DEFAULT_DRIVER_VERSION 12080
#define MOCK_DEFAULT_CONTEXT_OVERHEAD_MIB 300
#define MOCK_DEFAULT_KERNEL_TIME_US 1000
#define MOCK_DEFAULT_UTIL_WINDOW_MS 1000

/* ---- configuration (process-local, read from GPUSHARE_MOCK_CONFIG) ---------------------- */

struct mock_device_config {
    char name[MOCK_NAME_LEN];
    char uuid_text[MOCK_NAME_LEN]; /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    unsigned char uuid[16];
    uint64_t memory_bytes;
    int sm_count;
    uint64_t context_overhead_bytes;
    uint64_t kernel_time_ns;
    /* Discovery (nvml_node.c): PCI address, NUMA node, NVLink peers (one link each). */
    unsigned int pci_domain, pci_bus, pci_device;
    int numa;                      /* -1: no NUMA affinity */
    int nvlink_count;
    int nvlink_peers[MOCK_MAX_LINKS]; /* device indices */
};

struct mock_config {
    int driver_version;
    int device_count;
    uint64_t util_window_ns;
    char nvml_driver_version[MOCK_DRIVER_VERSION_LEN]; /* nvmlSystemGetDriverVersion */
    struct mock_device_config devices[MOCK_MAX_DEVICES];
};

/* ---- shared state (the memory-mapped state file) ----------------------------------------- */

#define MOCK_STATE_MAGIC 0x4750554d4f434b31ull /* "GPUMOCK1" */
#define MOCK_STATE_LAYOUT 3u /* 2: health records appended; 3: busy intervals carry a pid */

struct mock_proc_record {
    _Atomic int32_t pid;           /* 0: free slot */
    _Atomic uint32_t contexts;     /* contexts this process holds on the device */
    _Atomic uint64_t used_bytes;   /* device memory charged, context overhead included */
};

struct mock_interval {
    _Atomic uint64_t start_ns;     /* CLOCK_MONOTONIC */
    _Atomic uint64_t end_ns;
    _Atomic int32_t pid;           /* the process whose kernels ran (layout 3) */
    uint32_t reserved;
};

struct mock_device_shared {
    _Atomic uint64_t busy_until_ns;   /* end of the last kernel queued on the device */
    _Atomic uint64_t interval_count;  /* intervals ever recorded; slot = count % MAX */
    struct mock_interval intervals[MOCK_MAX_INTERVALS];
    struct mock_proc_record procs[MOCK_MAX_PROCS];
};

/* Health, for NVML events: Xids injected by gpushareMockInjectXid, in a ring per device. */
struct mock_device_health {
    _Atomic uint64_t xid_count;             /* Xids ever injected; slot = count % MAX */
    _Atomic uint64_t xids[MOCK_MAX_XIDS];
    _Atomic uint32_t retirement_pending;    /* nvmlDeviceGetRetiredPagesPendingStatus */
};

struct mock_shared {
    _Atomic uint64_t magic;        /* written last, once the rest is initialised */
    uint32_t layout;
    uint32_t device_count;
    uint64_t size;
    struct mock_device_shared devices[MOCK_MAX_DEVICES];
    struct mock_device_health health[MOCK_MAX_DEVICES];
};

/* ---- process snapshot for NVML ----------------------------------------------------------- */

struct mock_proc_usage {
    pid_t pid;
    uint64_t used_bytes;
};

/* One process's kernel time on a device within a window (nvmlDeviceGetProcessUtilization). */
struct mock_proc_busy {
    pid_t pid;
    uint64_t busy_ns;
};

/*
 * Loads the configuration and maps the state file, once per library; `who` names the library in
 * the error line ("cuda" or "nvml"). Returns 0, or -1 after printing one line to stderr.
 */
int mock_setup(const char *who);
const struct mock_config *mock_cfg(void); /* valid after mock_setup() returned 0 */

/* The cross-process lock (a process-local mutex plus flock on the state file). */
int mock_shared_lock(void);
void mock_shared_unlock(void);

/* The following need mock_shared_lock() held. */
uint64_t mock_device_used_locked(int device);
/* Charges bytes to this process on the device; false (nothing charged) when they do not fit. */
bool mock_charge_locked(int device, uint64_t bytes);
void mock_uncharge_locked(int device, uint64_t bytes);
void mock_contexts_add_locked(int device, int delta);
/* Queues a kernel of duration_ns, this process's, on the device's timeline; returns its end
 * time. Back-to-back kernels of the same process extend one busy interval. */
uint64_t mock_timeline_submit_locked(int device, uint64_t duration_ns);
unsigned int mock_utilization_locked(int device, uint64_t now_ns);
/* Each process's busy time on the device within [low_ns, high_ns) (CLOCK_MONOTONIC), from the
 * kept intervals: writes one entry per process with busy time > 0 into out, which must hold
 * MOCK_MAX_INTERVALS entries, sorted by pid; returns how many. */
unsigned int mock_process_busy_locked(int device, uint64_t low_ns, uint64_t high_ns,
                                      struct mock_proc_busy *out);
/* Fills up to max entries; returns how many live processes use the device. */
unsigned int mock_processes_locked(int device, struct mock_proc_usage *out, unsigned int max);
/* Drops every record of this process (at exit of the CUDA library). */
void mock_release_own_locked(void);

/* The device's health record in the state file (valid after mock_setup() returned 0). */
struct mock_device_health *mock_health(int device);

uint64_t mock_now_ns(void);
uint64_t mock_realtime_ns(void); /* CLOCK_REALTIME (NVML's sample timestamps) */
void mock_sleep_until_ns(uint64_t deadline_ns);

#endif /* GPUSHARE_MOCK_H */
