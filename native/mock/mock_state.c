/*
 * The mock's configuration file and its cross-process state file.
 *
 * Configuration: JSON named by GPUSHARE_MOCK_CONFIG (fields in docs/mock.md).
 * State: a file (GPUSHARE_MOCK_STATE, default "<config>.state") mapped MAP_SHARED by every
 * process using the mock. Creation and every read-modify-write happen under flock(LOCK_EX) on it
 * (plus a process-local mutex, since flock does not exclude threads sharing one descriptor).
 */
#include "mock.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONFIG_BYTES (1024 * 1024)

static struct mock_config g_config;
static struct mock_shared *g_shared;
static int g_fd = -1;
static pid_t g_fd_pid;           /* the process that opened g_fd (a forked child reopens) */
static char g_state_path[PATH_MAX];
static int g_setup_result = -1;
static _Atomic(const char *) g_who = "mock";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_own_slot[MOCK_MAX_DEVICES];

static void report(const char *path, const char *problem)
{
    fprintf(stderr, "gpushare mock %s: %s%s%s\n", atomic_load(&g_who), path ? path : "",
            path ? ": " : "", problem);
}

/* ---- configuration --------------------------------------------------------------------- */

static char *read_file(const char *path, char *problem, size_t problem_len)
{
    FILE *file = fopen(path, "rb");
    if (!file) {
        snprintf(problem, problem_len, "cannot open config file (%s)", strerror(errno));
        return NULL;
    }
    char *text = malloc(MAX_CONFIG_BYTES + 1);
    if (!text) {
        snprintf(problem, problem_len, "out of memory");
        (void)fclose(file);
        return NULL;
    }
    size_t length = fread(text, 1, MAX_CONFIG_BYTES + 1, file);
    int failed = ferror(file);
    if (fclose(file) != 0 || failed) {
        snprintf(problem, problem_len, "cannot read config file");
        free(text);
        return NULL;
    }
    if (length > MAX_CONFIG_BYTES) {
        snprintf(problem, problem_len, "config file larger than %d bytes", MAX_CONFIG_BYTES);
        free(text);
        return NULL;
    }
    text[length] = '\0';
    return text;
}

/* A JSON number that is a whole value in [lo, hi]; absent -> fallback (if optional). */
static bool get_integer(const cJSON *object, const char *key, bool required, double lo,
                        double hi, double fallback, double *out, char *problem,
                        size_t problem_len, int device)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
    if (!item) {
        if (required) {
            snprintf(problem, problem_len, "devices[%d]: missing \"%s\"", device, key);
            return false;
        }
        *out = fallback;
        return true;
    }
    double value = cJSON_IsNumber(item) ? item->valuedouble : NAN;
    if (!isfinite(value) || value != floor(value) || value < lo || value > hi) {
        if (device >= 0)
            snprintf(problem, problem_len, "devices[%d]: \"%s\" must be a whole number in "
                     "[%.0f, %.0f]", device, key, lo, hi);
        else
            snprintf(problem, problem_len, "\"%s\" must be a whole number in [%.0f, %.0f]", key,
                     lo, hi);
        return false;
    }
    *out = value;
    return true;
}

static bool parse_uuid(const char *text, unsigned char uuid[16])
{
    if (strncmp(text, "GPU-", 4) != 0)
        return false;
    int nibbles = 0;
    for (const char *p = text + 4; *p; p++) {
        if (*p == '-')
            continue;
        if (!isxdigit((unsigned char)*p) || nibbles >= 32)
            return false;
        int value = isdigit((unsigned char)*p) ? *p - '0' : tolower((unsigned char)*p) - 'a' + 10;
        if (nibbles % 2 == 0)
            uuid[nibbles / 2] = (unsigned char)(value << 4);
        else
            uuid[nibbles / 2] = (unsigned char)(uuid[nibbles / 2] | value);
        nibbles++;
    }
    return nibbles == 32;
}

static bool parse_device(const cJSON *entry, int index, struct mock_device_config *device,
                         char *problem, size_t problem_len)
{
    if (!cJSON_IsObject(entry)) {
        snprintf(problem, problem_len, "devices[%d] is not an object", index);
        return false;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(entry, "name");
    const cJSON *uuid = cJSON_GetObjectItemCaseSensitive(entry, "uuid");
    if (!cJSON_IsString(name) || name->valuestring[0] == '\0' ||
        strlen(name->valuestring) >= MOCK_NAME_LEN) {
        snprintf(problem, problem_len, "devices[%d]: \"name\" must be a string of 1-%d chars",
                 index, MOCK_NAME_LEN - 1);
        return false;
    }
    if (!cJSON_IsString(uuid) || strlen(uuid->valuestring) >= MOCK_NAME_LEN ||
        !parse_uuid(uuid->valuestring, device->uuid)) {
        snprintf(problem, problem_len,
                 "devices[%d]: \"uuid\" must look like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
                 index);
        return false;
    }
    snprintf(device->name, sizeof device->name, "%s", name->valuestring);
    snprintf(device->uuid_text, sizeof device->uuid_text, "%s", uuid->valuestring);
    double memory_mib, sm_count, overhead_mib, kernel_us;
    if (!get_integer(entry, "memory_mib", true, 1, 16.0 * 1024 * 1024, 0, &memory_mib, problem,
                     problem_len, index) ||
        !get_integer(entry, "sm_count", true, 1, 100000, 0, &sm_count, problem, problem_len,
                     index) ||
        !get_integer(entry, "context_overhead_mib", false, 0, 1024 * 1024,
                     MOCK_DEFAULT_CONTEXT_OVERHEAD_MIB, &overhead_mib, problem, problem_len,
                     index) ||
        !get_integer(entry, "kernel_time_us", false, 0, 3600.0 * 1e6, MOCK_DEFAULT_KERNEL_TIME_US,
                     &kernel_us, problem, problem_len, index))
        return false;
    double numa;
    if (!get_integer(entry, "numa", false, -1, 1023, 0, &numa, problem, problem_len, index))
        return false;
    device->numa = (int)numa;
    device->pci_domain = 0;
    device->pci_bus = 0x10u + (unsigned int)index;
    device->pci_device = 0;
    const cJSON *bus_id = cJSON_GetObjectItemCaseSensitive(entry, "pci_bus_id");
    if (bus_id) {
        unsigned int domain = 0, bus = 0, dev = 0, function = 0;
        int consumed = 0;
        if (!cJSON_IsString(bus_id) ||
            sscanf(bus_id->valuestring, "%8x:%2x:%2x.%1x%n", &domain, &bus, &dev, &function,
                   &consumed) != 4 ||
            bus_id->valuestring[consumed] != '\0' || function != 0 || dev > 0x1f) {
            snprintf(problem, problem_len,
                     "devices[%d]: \"pci_bus_id\" must look like 00000000:3B:00.0", index);
            return false;
        }
        device->pci_domain = domain;
        device->pci_bus = bus;
        device->pci_device = dev;
    }
    const cJSON *peers = cJSON_GetObjectItemCaseSensitive(entry, "nvlink_peers");
    device->nvlink_count = 0;
    if (peers) {
        if (!cJSON_IsArray(peers) || cJSON_GetArraySize(peers) > MOCK_MAX_LINKS) {
            snprintf(problem, problem_len,
                     "devices[%d]: \"nvlink_peers\" must be an array of at most %d device "
                     "indices", index, MOCK_MAX_LINKS);
            return false;
        }
        const cJSON *peer = NULL;
        cJSON_ArrayForEach(peer, peers) {
            double value = cJSON_IsNumber(peer) ? peer->valuedouble : -1;
            if (value != floor(value) || value < 0 || value >= MOCK_MAX_DEVICES ||
                (int)value == index) {
                snprintf(problem, problem_len,
                         "devices[%d]: \"nvlink_peers\" entries must be indices of other "
                         "devices", index);
                return false;
            }
            device->nvlink_peers[device->nvlink_count++] = (int)value;
        }
    }
    device->memory_bytes = (uint64_t)memory_mib * MOCK_MIB;
    device->sm_count = (int)sm_count;
    device->context_overhead_bytes = (uint64_t)overhead_mib * MOCK_MIB;
    device->kernel_time_ns = (uint64_t)kernel_us * 1000u;
    return true;
}

static bool parse_config(const char *text, struct mock_config *config, char *problem,
                         size_t problem_len)
{
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        snprintf(problem, problem_len, "not valid JSON");
        return false;
    }
    bool ok = false;
    double driver_version, window_ms;
    const cJSON *devices = cJSON_GetObjectItemCaseSensitive(root, "devices");
    if (!cJSON_IsObject(root)) {
        snprintf(problem, problem_len, "top level must be a JSON object");
    } else if (!get_integer(root, "driver_version", false, 2000, 99990,
                            MOCK_DEFAULT_DRIVER_VERSION, &driver_version, problem, problem_len,
                            -1) ||
               !get_integer(root, "utilization_window_ms", false, 10, 60000,
                            MOCK_DEFAULT_UTIL_WINDOW_MS, &window_ms, problem, problem_len, -1)) {
        /* problem already set */
    } else if (!cJSON_IsArray(devices) || cJSON_GetArraySize(devices) < 1 ||
               cJSON_GetArraySize(devices) > MOCK_MAX_DEVICES) {
        snprintf(problem, problem_len, "\"devices\" must be an array of 1-%d devices",
                 MOCK_MAX_DEVICES);
    } else {
        config->driver_version = (int)driver_version;
        config->util_window_ns = (uint64_t)window_ms * 1000000u;
        config->device_count = cJSON_GetArraySize(devices);
        ok = true;
        const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "nvml_driver_version");
        if (!version) {
            snprintf(config->nvml_driver_version, sizeof config->nvml_driver_version, "%s",
                     MOCK_DEFAULT_NVML_DRIVER_VERSION);
        } else if (!cJSON_IsString(version) || version->valuestring[0] == '\0' ||
                   strlen(version->valuestring) >= MOCK_DRIVER_VERSION_LEN) {
            snprintf(problem, problem_len,
                     "\"nvml_driver_version\" must be a string of 1-%d chars",
                     MOCK_DRIVER_VERSION_LEN - 1);
            ok = false;
        } else {
            snprintf(config->nvml_driver_version, sizeof config->nvml_driver_version, "%s",
                     version->valuestring);
        }
        for (int i = 0; ok && i < config->device_count; i++)
            ok = parse_device(cJSON_GetArrayItem(devices, i), i, &config->devices[i], problem,
                              problem_len);
        for (int i = 0; ok && i < config->device_count; i++) {
            for (int k = 0; ok && k < config->devices[i].nvlink_count; k++) {
                if (config->devices[i].nvlink_peers[k] >= config->device_count) {
                    snprintf(problem, problem_len,
                             "devices[%d]: \"nvlink_peers\": no device %d", i,
                             config->devices[i].nvlink_peers[k]);
                    ok = false;
                }
            }
        }
    }
    cJSON_Delete(root);
    return ok;
}

/* ---- state file ------------------------------------------------------------------------ */

static int flock_retry(int fd, int operation)
{
    int rc;
    do {
        rc = flock(fd, operation);
    } while (rc != 0 && errno == EINTR);
    return rc;
}

static int open_state(const char *path, char *problem, size_t problem_len)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(problem, problem_len, "cannot open state file %s (%s)", path, strerror(errno));
        return -1;
    }
    if (flock_retry(fd, LOCK_EX) != 0) {
        snprintf(problem, problem_len, "cannot lock state file %s (%s)", path, strerror(errno));
        (void)close(fd);
        return -1;
    }
    struct stat st;
    bool fresh = false;
    if (fstat(fd, &st) != 0) {
        snprintf(problem, problem_len, "cannot stat state file %s (%s)", path, strerror(errno));
        goto fail;
    }
    if ((uint64_t)st.st_size != sizeof(struct mock_shared)) {
        /* New, or from another layout: start from zeroes. */
        if (ftruncate(fd, 0) != 0 || ftruncate(fd, (off_t)sizeof(struct mock_shared)) != 0) {
            snprintf(problem, problem_len, "cannot size state file %s (%s)", path,
                     strerror(errno));
            goto fail;
        }
        fresh = true;
    }
    void *map = mmap(NULL, sizeof(struct mock_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        snprintf(problem, problem_len, "cannot map state file %s (%s)", path, strerror(errno));
        goto fail;
    }
    struct mock_shared *shared = map;
    if (fresh || atomic_load(&shared->magic) != MOCK_STATE_MAGIC ||
        shared->layout != MOCK_STATE_LAYOUT || shared->size != sizeof(struct mock_shared) ||
        shared->device_count != (uint32_t)g_config.device_count) {
        atomic_store(&shared->magic, 0);
        memset((char *)shared + sizeof shared->magic, 0,
               sizeof(struct mock_shared) - sizeof shared->magic);
        shared->layout = MOCK_STATE_LAYOUT;
        shared->size = sizeof(struct mock_shared);
        shared->device_count = (uint32_t)g_config.device_count;
        atomic_store(&shared->magic, MOCK_STATE_MAGIC);
    }
    if (flock_retry(fd, LOCK_UN) != 0) {
        snprintf(problem, problem_len, "cannot unlock state file %s (%s)", path,
                 strerror(errno));
        (void)munmap(map, sizeof(struct mock_shared));
        (void)close(fd);
        return -1;
    }
    g_shared = shared;
    g_fd = fd;
    g_fd_pid = getpid();
    return 0;
fail:
    (void)flock_retry(fd, LOCK_UN);
    (void)close(fd);
    return -1;
}

static void setup_once(void)
{
    char problem[PATH_MAX + 512] = "";
    const char *path = getenv("GPUSHARE_MOCK_CONFIG");
    if (!path || !*path) {
        report(NULL, "GPUSHARE_MOCK_CONFIG is not set; it must name the mock's JSON config file");
        return;
    }
    char *text = read_file(path, problem, sizeof problem);
    if (!text) {
        report(path, problem);
        return;
    }
    bool ok = parse_config(text, &g_config, problem, sizeof problem);
    free(text);
    if (!ok) {
        report(path, problem);
        return;
    }
    const char *state = getenv("GPUSHARE_MOCK_STATE");
    int written = (state && *state) ? snprintf(g_state_path, sizeof g_state_path, "%s", state)
                                    : snprintf(g_state_path, sizeof g_state_path, "%s.state", path);
    if (written < 0 || (size_t)written >= sizeof g_state_path) {
        report(path, "state file path too long");
        return;
    }
    if (open_state(g_state_path, problem, sizeof problem) != 0) {
        report(path, problem);
        return;
    }
    for (int i = 0; i < MOCK_MAX_DEVICES; i++)
        g_own_slot[i] = -1;
    g_setup_result = 0;
}

int mock_setup(const char *who)
{
    atomic_store(&g_who, who);
    if (pthread_once(&g_once, setup_once) != 0)
        return -1;
    return g_setup_result;
}

const struct mock_config *mock_cfg(void)
{
    return &g_config;
}

struct mock_device_health *mock_health(int device)
{
    return &g_shared->health[device];
}

/* ---- locking --------------------------------------------------------------------------- */

int mock_shared_lock(void)
{
    if (g_setup_result != 0 || pthread_mutex_lock(&g_lock) != 0)
        return -1;
    if (g_fd_pid != getpid()) {
        /* A forked child shares the parent's open file description, hence its flock. */
        int fd = open(g_state_path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            (void)pthread_mutex_unlock(&g_lock);
            return -1;
        }
        (void)close(g_fd);
        g_fd = fd;
        g_fd_pid = getpid();
        for (int i = 0; i < MOCK_MAX_DEVICES; i++)
            g_own_slot[i] = -1;
    }
    if (flock_retry(g_fd, LOCK_EX) != 0) {
        (void)pthread_mutex_unlock(&g_lock);
        return -1;
    }
    return 0;
}

void mock_shared_unlock(void)
{
    (void)flock_retry(g_fd, LOCK_UN);
    (void)pthread_mutex_unlock(&g_lock);
}

/* ---- per-process records --------------------------------------------------------------- */

static bool pid_alive(pid_t pid)
{
    if (kill(pid, 0) != 0)
        return errno != ESRCH;
    /* A zombie has exited: its memory is gone even if nobody reaped it yet. */
    char path[64], buffer[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return true;
    ssize_t length = read(fd, buffer, sizeof buffer - 1);
    (void)close(fd);
    if (length <= 0)
        return true;
    buffer[length] = '\0';
    const char *paren = strrchr(buffer, ')');
    return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

static void reclaim_dead_locked(struct mock_device_shared *device)
{
    pid_t self = getpid();
    for (int i = 0; i < MOCK_MAX_PROCS; i++) {
        struct mock_proc_record *record = &device->procs[i];
        pid_t pid = atomic_load(&record->pid);
        if (pid != 0 && pid != self && !pid_alive(pid)) {
            atomic_store(&record->used_bytes, 0);
            atomic_store(&record->contexts, 0);
            atomic_store(&record->pid, 0);
        }
    }
}

static struct mock_proc_record *own_record_locked(int device)
{
    struct mock_device_shared *shared = &g_shared->devices[device];
    pid_t self = getpid();
    int slot = g_own_slot[device];
    if (slot >= 0 && atomic_load(&shared->procs[slot].pid) == self)
        return &shared->procs[slot];
    int free_slot = -1;
    for (int i = 0; i < MOCK_MAX_PROCS; i++) {
        pid_t pid = atomic_load(&shared->procs[i].pid);
        if (pid == self) {
            g_own_slot[device] = i;
            return &shared->procs[i];
        }
        if (pid == 0 && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0) {
        reclaim_dead_locked(shared);
        for (int i = 0; i < MOCK_MAX_PROCS && free_slot < 0; i++)
            if (atomic_load(&shared->procs[i].pid) == 0)
                free_slot = i;
        if (free_slot < 0)
            return NULL;
    }
    struct mock_proc_record *record = &shared->procs[free_slot];
    atomic_store(&record->used_bytes, 0);
    atomic_store(&record->contexts, 0);
    atomic_store(&record->pid, self);
    g_own_slot[device] = free_slot;
    return record;
}

uint64_t mock_device_used_locked(int device)
{
    struct mock_device_shared *shared = &g_shared->devices[device];
    reclaim_dead_locked(shared);
    uint64_t used = 0;
    for (int i = 0; i < MOCK_MAX_PROCS; i++)
        if (atomic_load(&shared->procs[i].pid) != 0)
            used += atomic_load(&shared->procs[i].used_bytes);
    return used;
}

bool mock_charge_locked(int device, uint64_t bytes)
{
    uint64_t used = mock_device_used_locked(device);
    uint64_t total = g_config.devices[device].memory_bytes;
    if (used > total || bytes > total - used)
        return false;
    struct mock_proc_record *record = own_record_locked(device);
    if (!record)
        return false;
    atomic_fetch_add(&record->used_bytes, bytes);
    return true;
}

void mock_uncharge_locked(int device, uint64_t bytes)
{
    struct mock_proc_record *record = own_record_locked(device);
    if (!record)
        return;
    uint64_t used = atomic_load(&record->used_bytes);
    atomic_store(&record->used_bytes, used >= bytes ? used - bytes : 0);
}

void mock_contexts_add_locked(int device, int delta)
{
    struct mock_proc_record *record = own_record_locked(device);
    if (!record)
        return;
    uint32_t contexts = atomic_load(&record->contexts);
    if (delta < 0 && contexts < (uint32_t)-delta)
        contexts = 0;
    else
        contexts = (uint32_t)((int64_t)contexts + delta);
    atomic_store(&record->contexts, contexts);
}

unsigned int mock_processes_locked(int device, struct mock_proc_usage *out, unsigned int max)
{
    struct mock_device_shared *shared = &g_shared->devices[device];
    reclaim_dead_locked(shared);
    unsigned int count = 0;
    for (int i = 0; i < MOCK_MAX_PROCS; i++) {
        struct mock_proc_record *record = &shared->procs[i];
        pid_t pid = atomic_load(&record->pid);
        uint64_t used = atomic_load(&record->used_bytes);
        if (pid == 0 || (used == 0 && atomic_load(&record->contexts) == 0))
            continue;
        if (count < max) {
            out[count].pid = pid;
            out[count].used_bytes = used;
        }
        count++;
    }
    return count;
}

void mock_release_own_locked(void)
{
    pid_t self = getpid();
    for (int d = 0; d < g_config.device_count; d++) {
        struct mock_device_shared *shared = &g_shared->devices[d];
        for (int i = 0; i < MOCK_MAX_PROCS; i++) {
            struct mock_proc_record *record = &shared->procs[i];
            if (atomic_load(&record->pid) == self) {
                atomic_store(&record->used_bytes, 0);
                atomic_store(&record->contexts, 0);
                atomic_store(&record->pid, 0);
            }
        }
        g_own_slot[d] = -1;
    }
}

/* ---- timeline -------------------------------------------------------------------------- */

uint64_t mock_now_ns(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
        return 0;
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

void mock_sleep_until_ns(uint64_t deadline_ns)
{
    struct timespec until = {
        .tv_sec = (time_t)(deadline_ns / 1000000000u),
        .tv_nsec = (long)(deadline_ns % 1000000000u),
    };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
    }
}

uint64_t mock_realtime_ns(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0 || now.tv_sec < 0)
        return 0;
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

uint64_t mock_timeline_submit_locked(int device, uint64_t duration_ns)
{
    struct mock_device_shared *shared = &g_shared->devices[device];
    int32_t self = (int32_t)getpid();
    uint64_t now = mock_now_ns();
    uint64_t busy_until = atomic_load(&shared->busy_until_ns);
    uint64_t start = busy_until > now ? busy_until : now;
    if (duration_ns == 0)
        return start;
    uint64_t end = start + duration_ns;
    if (end < start)
        end = UINT64_MAX; /* saturate: a kernel that never ends in practice */
    atomic_store(&shared->busy_until_ns, end);
    uint64_t count = atomic_load(&shared->interval_count);
    if (count > 0) {
        struct mock_interval *last = &shared->intervals[(count - 1) % MOCK_MAX_INTERVALS];
        /* Back to back with this process's own last kernel: extend that interval. Another
         * process's interval is never extended, so each interval has one owner. */
        if (atomic_load(&last->end_ns) == start && atomic_load(&last->pid) == self) {
            atomic_store(&last->end_ns, end);
            return end;
        }
    }
    struct mock_interval *slot = &shared->intervals[count % MOCK_MAX_INTERVALS];
    atomic_store(&slot->start_ns, start);
    atomic_store(&slot->end_ns, end);
    atomic_store(&slot->pid, self);
    atomic_store(&shared->interval_count, count + 1);
    return end;
}

static int compare_busy_pid(const void *a, const void *b)
{
    pid_t left = ((const struct mock_proc_busy *)a)->pid;
    pid_t right = ((const struct mock_proc_busy *)b)->pid;
    return (left > right) - (left < right);
}

unsigned int mock_process_busy_locked(int device, uint64_t low_ns, uint64_t high_ns,
                                      struct mock_proc_busy *out)
{
    struct mock_device_shared *shared = &g_shared->devices[device];
    uint64_t count = atomic_load(&shared->interval_count);
    uint64_t kept = count < MOCK_MAX_INTERVALS ? count : MOCK_MAX_INTERVALS;
    unsigned int pieces = 0;
    for (uint64_t k = 0; k < kept && low_ns < high_ns; k++) {
        const struct mock_interval *interval =
            &shared->intervals[(count - 1 - k) % MOCK_MAX_INTERVALS];
        uint64_t start = atomic_load(&interval->start_ns);
        uint64_t end = atomic_load(&interval->end_ns);
        if (end <= low_ns)
            break; /* intervals are recorded in time order */
        if (start < low_ns)
            start = low_ns;
        if (end > high_ns)
            end = high_ns;
        if (end <= start)
            continue; /* queued after the window */
        out[pieces].pid = (pid_t)atomic_load(&interval->pid);
        out[pieces].busy_ns = end - start;
        pieces++;
    }
    if (pieces == 0)
        return 0;
    /* One entry per process: sort the pieces by pid, then add up each run. */
    qsort(out, pieces, sizeof *out, compare_busy_pid);
    unsigned int processes = 0;
    for (unsigned int i = 0; i < pieces; i++) {
        if (processes > 0 && out[processes - 1].pid == out[i].pid) {
            out[processes - 1].busy_ns += out[i].busy_ns;
        } else {
            out[processes] = out[i];
            processes++;
        }
    }
    return processes;
}

unsigned int mock_utilization_locked(int device, uint64_t now_ns)
{
    struct mock_device_shared *shared = &g_shared->devices[device];
    uint64_t window = g_config.util_window_ns;
    uint64_t low = now_ns > window ? now_ns - window : 0;
    uint64_t count = atomic_load(&shared->interval_count);
    uint64_t kept = count < MOCK_MAX_INTERVALS ? count : MOCK_MAX_INTERVALS;
    uint64_t busy = 0;
    for (uint64_t k = 0; k < kept; k++) {
        const struct mock_interval *interval = &shared->intervals[(count - 1 - k) % MOCK_MAX_INTERVALS];
        uint64_t start = atomic_load(&interval->start_ns);
        uint64_t end = atomic_load(&interval->end_ns);
        if (end <= low)
            break; /* intervals are recorded in time order */
        if (start < low)
            start = low;
        if (end > now_ns)
            end = now_ns;
        if (end > start)
            busy += end - start;
    }
    if (now_ns - low == 0)
        return 0;
    uint64_t percent = (busy * 100u + (now_ns - low) / 2) / (now_ns - low);
    return percent > 100 ? 100u : (unsigned int)percent;
}
