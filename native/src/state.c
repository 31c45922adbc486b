/*
 * The shared state file: per-device usage shared by every process of the container, and a
 * table of process slots so that the usage of a process that died without cleaning up (SIGKILL)
 * can be given back. No lock anywhere: creation is published with a release store of the magic,
 * slots are claimed and reclaimed with compare-and-swap, usage is reserved with compare-and-swap.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "state.h"

_Static_assert(GS_MAX_PROCESSES == GS_STATE_SLOTS, "one process per slot");

static struct gs_state_file *state;
static _Atomic int my_slot = -1;

static void state_error(const char *path, const char *problem) {
    fprintf(stderr, "gpushare: state file %s: %s; refusing GPU allocations in this process\n",
            path, problem);
}

/* Field 22 (starttime) of /proc/<pid>/stat; 0 when unreadable. Uses only open/read/close. */
static uint64_t proc_start_time(uint32_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    char buf[1024];
    ssize_t n;
    do {
        n = read(fd, buf, sizeof buf - 1);
    } while (n < 0 && errno == EINTR);
    (void)close(fd);
    if (n <= 0) {
        return 0;
    }
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may contain spaces and parentheses */
    if (p == NULL) {
        return 0;
    }
    /* After ")" come fields 3.. ; starttime is field 22, i.e. the 20th after ")". */
    int field = 2;
    p++;
    while (*p != '\0' && field < 22) {
        if (*p == ' ') {
            field++;
        }
        p++;
    }
    uint64_t value = 0;
    while (*p >= '0' && *p <= '9') {
        value = value * 10 + (uint64_t)(*p - '0');
        p++;
    }
    return value;
}

static int pid_alive(uint32_t pid) {
    if (pid == 0 || pid > (uint32_t)INT32_MAX) {
        return 0;
    }
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

static void saturating_sub(_Atomic uint64_t *value, uint64_t amount) {
    uint64_t current = atomic_load_explicit(value, memory_order_relaxed);
    uint64_t next;
    do {
        next = current > amount ? current - amount : 0;
    } while (!atomic_compare_exchange_weak_explicit(value, &current, next, memory_order_acq_rel,
                                                    memory_order_relaxed));
}

/* Give a slot's usage back to the device totals and free it. Caller owns the slot's tag. */
static void drain_slot(struct gs_state_slot *slot) {
    for (int d = 0; d < GS_MAX_DEVICES; d++) {
        uint64_t used = atomic_exchange_explicit(&slot->used[d], 0, memory_order_acq_rel);
        if (used != 0) {
            saturating_sub(&state->devices[d].used, used);
        }
    }
    atomic_store_explicit(&slot->start_time, 0, memory_order_relaxed);
    atomic_store_explicit(&slot->tag, 0, memory_order_release);
}

int gs_state_reclaim(void) {
    if (state == NULL) {
        return 0;
    }
    uint32_t self = (uint32_t)getpid();
    int mine = atomic_load_explicit(&my_slot, memory_order_relaxed);
    int reclaimed = 0;
    for (int i = 0; i < (int)GS_STATE_SLOTS; i++) {
        struct gs_state_slot *slot = &state->slots[i];
        uint64_t tag = atomic_load_explicit(&slot->tag, memory_order_acquire);
        if (tag == 0 || (tag & GS_SLOT_RECLAIMING) != 0 || i == mine) {
            continue;
        }
        uint32_t pid = (uint32_t)(tag & GS_SLOT_PID_MASK);
        int dead;
        if (pid == self) {
            /* Our pid but not our slot: left by this process image before an exec. */
            dead = (tag & GS_SLOT_CLAIMING) == 0;
        } else if (!pid_alive(pid)) {
            dead = 1;
        } else if ((tag & GS_SLOT_CLAIMING) != 0) {
            dead = 0; /* owner is still filling it in */
        } else {
            uint64_t recorded = atomic_load_explicit(&slot->start_time, memory_order_relaxed);
            uint64_t actual = proc_start_time(pid);
            dead = actual != 0 && recorded != 0 && actual != recorded; /* pid reused */
        }
        if (!dead) {
            continue;
        }
        if (atomic_compare_exchange_strong_explicit(&slot->tag, &tag, tag | GS_SLOT_RECLAIMING,
                                                    memory_order_acq_rel,
                                                    memory_order_relaxed)) {
            drain_slot(slot);
            reclaimed++;
        }
    }
    return reclaimed;
}

static int claim_slot(void) {
    uint32_t self = (uint32_t)getpid();
    uint64_t start = proc_start_time(self);
    for (int attempt = 0; attempt < 2; attempt++) {
        for (int i = 0; i < (int)GS_STATE_SLOTS; i++) {
            struct gs_state_slot *slot = &state->slots[i];
            uint64_t expected = 0;
            if (atomic_compare_exchange_strong_explicit(&slot->tag, &expected,
                                                        self | GS_SLOT_CLAIMING,
                                                        memory_order_acq_rel,
                                                        memory_order_relaxed)) {
                atomic_store_explicit(&slot->start_time, start, memory_order_relaxed);
                atomic_store_explicit(&slot->tag, self, memory_order_release);
                atomic_store_explicit(&my_slot, i, memory_order_release);
                return 0;
            }
        }
        (void)gs_state_reclaim();
    }
    return -1;
}

static int sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
        if (errno != EINTR) {
            return -1;
        }
    }
    return 0;
}

static int create_file(int fd, const char *path, const struct gs_config *config) {
    if (fchmod(fd, 0666) != 0 || ftruncate(fd, (off_t)sizeof(struct gs_state_file)) != 0) {
        state_error(path, strerror(errno));
        return -1;
    }
    void *map = mmap(NULL, sizeof(struct gs_state_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        state_error(path, strerror(errno));
        return -1;
    }
    struct gs_state_file *file = map;
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
        now.tv_sec = 0;
        now.tv_nsec = 0;
    }
    file->header.version = GS_STATE_VERSION;
    file->header.header_size = sizeof(struct gs_state_header);
    file->header.device_count = GS_MAX_DEVICES;
    file->header.slot_count = GS_STATE_SLOTS;
    file->header.slot_size = sizeof(struct gs_state_slot);
    file->header.device_size = sizeof(struct gs_state_device);
    file->header.file_size = sizeof(struct gs_state_file);
    file->header.created_unix_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    for (int d = 0; d < GS_MAX_DEVICES; d++) {
        atomic_store_explicit(&file->devices[d].limit, gs_config_limit(config, d),
                              memory_order_relaxed);
    }
    atomic_store_explicit(&file->header.magic, GS_STATE_MAGIC, memory_order_release);
    state = file;
    return 0;
}

static int open_existing(int fd, const char *path) {
    /* The creator may still be between O_EXCL and ftruncate/publication: bounded wait (2 s). */
    const int max_wait_ms = 2000;
    for (int waited = 0;; waited++) {
        struct stat st;
        if (fstat(fd, &st) != 0) {
            state_error(path, strerror(errno));
            return -1;
        }
        if (st.st_size >= (off_t)sizeof(uint64_t)) {
            uint64_t magic = 0;
            ssize_t n = pread(fd, &magic, sizeof magic, 0);
            if (n == (ssize_t)sizeof magic && magic != 0 && magic != GS_STATE_MAGIC) {
                state_error(path, "not a gpushare state file (wrong magic)");
                return -1;
            }
            uint32_t version = 0;
            if (n == (ssize_t)sizeof magic && magic == GS_STATE_MAGIC &&
                pread(fd, &version, sizeof version, 8) == (ssize_t)sizeof version &&
                version != GS_STATE_VERSION) {
                char problem[96];
                snprintf(problem, sizeof problem, "unsupported version %u (this library: %u)",
                         version, GS_STATE_VERSION);
                state_error(path, problem);
                return -1;
            }
            if (n == (ssize_t)sizeof magic && magic == GS_STATE_MAGIC &&
                st.st_size != (off_t)sizeof(struct gs_state_file)) {
                /* The creator sizes the file before it publishes the magic. */
                state_error(path, "truncated or wrong size for the version-1 layout");
                return -1;
            }
            if (st.st_size > (off_t)sizeof(struct gs_state_file)) {
                state_error(path, "wrong size (foreign or corrupted file)");
                return -1;
            }
        }
        if (st.st_size == (off_t)sizeof(struct gs_state_file)) {
            break;
        }
        if (waited >= max_wait_ms) {
            state_error(path, "truncated (smaller than the version-1 layout)");
            return -1;
        }
        if (sleep_ms(1) != 0) {
            state_error(path, strerror(errno));
            return -1;
        }
    }
    void *map = mmap(NULL, sizeof(struct gs_state_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        state_error(path, strerror(errno));
        return -1;
    }
    struct gs_state_file *file = map;
    for (int waited = 0;; waited++) {
        uint64_t magic = atomic_load_explicit(&file->header.magic, memory_order_acquire);
        if (magic == GS_STATE_MAGIC) {
            break;
        }
        if (magic != 0) {
            state_error(path, "not a gpushare state file (wrong magic)");
            (void)munmap(map, sizeof(struct gs_state_file));
            return -1;
        }
        if (waited >= max_wait_ms || sleep_ms(1) != 0) {
            state_error(path, "never initialised (creator died?); remove it");
            (void)munmap(map, sizeof(struct gs_state_file));
            return -1;
        }
    }
    const struct gs_state_header *h = &file->header;
    if (h->version != GS_STATE_VERSION || h->header_size != sizeof(struct gs_state_header) ||
        h->device_count != GS_MAX_DEVICES || h->slot_count != GS_STATE_SLOTS ||
        h->slot_size != sizeof(struct gs_state_slot) ||
        h->device_size != sizeof(struct gs_state_device) ||
        h->file_size != sizeof(struct gs_state_file)) {
        state_error(path, "unsupported version or layout");
        (void)munmap(map, sizeof(struct gs_state_file));
        return -1;
    }
    state = file;
    return 0;
}

int gs_state_open(const struct gs_config *config) {
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", config->state_dir, GS_STATE_FILE);
    if (n < 0 || (size_t)n >= sizeof path) {
        state_error(config->state_dir, "path too long");
        return -1;
    }
    if (mkdir(config->state_dir, 0755) != 0 && errno != EEXIST) {
        state_error(path, strerror(errno));
        return -1;
    }
    int rc;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd >= 0) {
        rc = create_file(fd, path, config);
    } else if (errno == EEXIST) {
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
            state_error(path, strerror(errno));
            return -1;
        }
        rc = open_existing(fd, path);
    } else {
        state_error(path, strerror(errno));
        return -1;
    }
    if (close(fd) != 0 && rc == 0) {
        state_error(path, strerror(errno));
        rc = -1;
    }
    if (rc != 0) {
        state = NULL;
        return -1;
    }
    (void)gs_state_reclaim();
    if (claim_slot() != 0) {
        state_error(path, "all 256 process slots are in use by live processes");
        state = NULL;
        return -1;
    }
    return 0;
}

int gs_state_reserve(int device, uint64_t bytes, uint64_t limit) {
    int slot = atomic_load_explicit(&my_slot, memory_order_acquire);
    if (state == NULL || slot < 0 || device < 0 || device >= GS_MAX_DEVICES) {
        return -1;
    }
    _Atomic uint64_t *used = &state->devices[device].used;
    uint64_t current = atomic_load_explicit(used, memory_order_relaxed);
    do {
        if (bytes > limit || current > limit - bytes) {
            return -1;
        }
    } while (!atomic_compare_exchange_weak_explicit(used, &current, current + bytes,
                                                    memory_order_acq_rel, memory_order_relaxed));
    atomic_fetch_add_explicit(&state->slots[slot].used[device], bytes, memory_order_acq_rel);
    return 0;
}

void gs_state_release(int device, uint64_t bytes) {
    int slot = atomic_load_explicit(&my_slot, memory_order_acquire);
    if (state == NULL || slot < 0 || device < 0 || device >= GS_MAX_DEVICES || bytes == 0) {
        return;
    }
    saturating_sub(&state->slots[slot].used[device], bytes);
    saturating_sub(&state->devices[device].used, bytes);
}

uint64_t gs_state_used(int device) {
    if (state == NULL || device < 0 || device >= GS_MAX_DEVICES) {
        return 0;
    }
    return atomic_load_explicit(&state->devices[device].used, memory_order_acquire);
}

unsigned gs_state_processes(int device, struct gs_state_process *out, unsigned max) {
    if (state == NULL || device < 0 || device >= GS_MAX_DEVICES) {
        return 0;
    }
    unsigned count = 0;
    for (int i = 0; i < (int)GS_STATE_SLOTS; i++) {
        struct gs_state_slot *slot = &state->slots[i];
        uint64_t tag = atomic_load_explicit(&slot->tag, memory_order_acquire);
        if (tag == 0 || (tag & (GS_SLOT_CLAIMING | GS_SLOT_RECLAIMING)) != 0) {
            continue;
        }
        uint32_t pid = (uint32_t)(tag & GS_SLOT_PID_MASK);
        uint64_t used = atomic_load_explicit(&slot->used[device], memory_order_relaxed);
        if (used == 0 || !pid_alive(pid)) {
            continue;
        }
        if (count < max) {
            out[count].pid = pid;
            out[count].used = used;
        }
        count++;
    }
    return count;
}

void gs_state_release_slot(void) {
    int slot = atomic_exchange_explicit(&my_slot, -1, memory_order_acq_rel);
    if (state == NULL || slot < 0) {
        return;
    }
    struct gs_state_slot *s = &state->slots[slot];
    uint64_t tag = atomic_load_explicit(&s->tag, memory_order_acquire);
    if (tag != 0 && (tag & GS_SLOT_RECLAIMING) == 0 &&
        atomic_compare_exchange_strong_explicit(&s->tag, &tag, tag | GS_SLOT_RECLAIMING,
                                                memory_order_acq_rel, memory_order_relaxed)) {
        drain_slot(s);
    }
}

/* In a fork child: the parent's slot stays the parent's; claim our own. */
int gs_state_reclaim_slot_after_fork(void) {
    atomic_store_explicit(&my_slot, -1, memory_order_release);
    if (state == NULL) {
        return 0;
    }
    return claim_slot();
}

/* Charge without the limit check: memory the driver already reserved behind our back (a pool
 * that grew between two observations). Keeps the accounting truthful; see docs/isolation.md. */
void gs_state_force(int device, uint64_t bytes) {
    int slot = atomic_load_explicit(&my_slot, memory_order_acquire);
    if (state == NULL || slot < 0 || device < 0 || device >= GS_MAX_DEVICES || bytes == 0) {
        return;
    }
    atomic_fetch_add_explicit(&state->devices[device].used, bytes, memory_order_acq_rel);
    atomic_fetch_add_explicit(&state->slots[slot].used[device], bytes, memory_order_acq_rel);
}

void gs_state_count_refusal(void) {
    if (state != NULL) {
        atomic_fetch_add_explicit(&state->header.refused_allocations, 1, memory_order_relaxed);
    }
}

struct gs_state_device *gs_state_device(int device) {
    if (state == NULL || device < 0 || device >= GS_MAX_DEVICES) {
        return NULL;
    }
    return &state->devices[device];
}
