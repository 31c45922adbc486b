/*
 * Compute throttle: the container may keep a device busy core_limit_percent of the time.
 *
 * Rate: a GCRA token bucket ("virtual scheduling") per device, in the shared state file so that
 * all processes of the container draw from one budget. Each launch is charged an estimate of
 * its GPU time, cost; at share p it advances the device's theoretical arrival time (TAT) by
 * cost / p of wall time. A launch may run while TAT is at most BURST ahead of now, otherwise it
 * sleeps until it is. One 64-bit CAS per launch; no lock, no cross-process coordination.
 *
 * Estimate: the driver does not say how long a kernel runs, so a sampler thread reads
 * nvmlDeviceGetUtilizationRates every SAMPLE_NS and corrects the shared cost: utilisation u
 * measured at target p means the real average kernel time is cost * u / p (launches are paced
 * at p / cost per unit of time, each keeping the GPU busy for the real time). The correction
 * is damped (halfway per step, at most x2 / x0.5) and only applied when it is meaningful:
 * measured above target (charge more), or below target while launches were being held back
 * (charge less); an idle or lightly loaded application does not drag the estimate down.
 * Kernel and graph launches have separate estimates (a graph runs many kernels); each step
 * corrects each kind in proportion to its share of what was charged in the last period.
 * See docs/isolation.md for why this converges and its limits.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "state.h"

#define BURST_NS 20000000ull        /* 20 ms of wall time may be run ahead */
#define SAMPLE_NS 100000000ull      /* feedback period: 100 ms */
#define INITIAL_COST_NS 100000ull   /* 100 us until the feedback has spoken */
#define MIN_COST_NS 1000ull
#define MAX_COST_NS 1000000000ull

static unsigned share_percent;
static _Atomic int limiter_on;
static _Atomic int sampler_started;

static uint64_t now_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        return 0;
    }
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Per-kind estimate: [GS_LAUNCH_KERNEL] launch_cost_ns, [GS_LAUNCH_GRAPH] graph_cost_ns. */
static _Atomic uint64_t *cost_field(struct gs_state_device *d, enum gs_launch_kind kind) {
    return kind == GS_LAUNCH_GRAPH ? &d->graph_cost_ns : &d->launch_cost_ns;
}

static uint64_t cost_of(struct gs_state_device *d, enum gs_launch_kind kind) {
    uint64_t cost = atomic_load_explicit(cost_field(d, kind), memory_order_relaxed);
    return cost == 0 ? INITIAL_COST_NS : cost;
}

/* ---- feedback ------------------------------------------------------------------------- */

/* One damped correction step of one kind's estimate: the measured / target ratio (clamped to
 * [1/2, 2]) is applied with weight `gain` (see adapt) and the estimate moves halfway there. */
static void correct(struct gs_state_device *d, enum gs_launch_kind kind, double gain,
                    unsigned measured, unsigned target) {
    if (gain <= 0.0) {
        return;
    }
    double ratio = (double)measured / (double)target;
    ratio = ratio < 0.5 ? 0.5 : ratio > 2.0 ? 2.0 : ratio;
    double cost = (double)cost_of(d, kind);
    double next = (cost + cost * (1.0 + gain * (ratio - 1.0))) / 2.0;
    uint64_t value = next < (double)MIN_COST_NS   ? MIN_COST_NS
                     : next > (double)MAX_COST_NS ? MAX_COST_NS
                                                  : (uint64_t)next;
    atomic_store_explicit(cost_field(d, kind), value, memory_order_relaxed);
}

static void adapt(int device, nvmlDevice_t handle) {
    struct gs_state_device *d = gs_state_device(device);
    __typeof__(&nvmlDeviceGetUtilizationRates) get_util =
        (__typeof__(&nvmlDeviceGetUtilizationRates))gs_real_nvml(GS_FN_nvmlDeviceGetUtilizationRates);
    nvmlUtilization_t util;
    if (d == NULL || get_util == NULL || get_util(handle, &util) != NVML_SUCCESS) {
        return;
    }
    uint64_t now = now_ns();
    uint64_t last = atomic_load_explicit(&d->adapted_at_ns, memory_order_relaxed);
    if (now - last < SAMPLE_NS * 9 / 10 ||
        !atomic_compare_exchange_strong_explicit(&d->adapted_at_ns, &last, now,
                                                 memory_order_acq_rel, memory_order_relaxed)) {
        return; /* another process of the container adapted this period */
    }
    /* What was charged since the last step, per kind (microseconds, packed; see state.h). */
    uint64_t mix = atomic_exchange_explicit(&d->charged_mix, 0, memory_order_relaxed);
    uint64_t kernel_us = mix & 0xffffffffull, graph_us = mix >> 32;
    uint64_t throttled = atomic_load_explicit(&d->throttled_at_ns, memory_order_relaxed);
    int held_back = throttled != 0 && now - throttled < 2 * SAMPLE_NS;
    unsigned target = share_percent;
    unsigned measured = util.gpu;
    if (!(measured > target + 1 || (held_back && measured + 1 < target))) {
        return;
    }
    /* Each kind is corrected in proportion to its part f of the charged time: a period of graph
     * launches only teaches the graph estimate, one of kernels only the kernel estimate, and a
     * mix moves both. The weights f / (f_kernel^2 + f_graph^2) make the total charge move by
     * exactly the single-estimate step (sum of f * weight = 1), so a steady mix converges as
     * fast as one kind alone; each weight is at most 1.21. No charge recorded (work queued
     * earlier) or an implausible record (counters left running for an hour without a sampler,
     * so a half overflowed): correct both fully, as a single shared estimate would. */
    double kernel_gain = 1.0, graph_gain = 1.0;
    if (mix != 0 && kernel_us < (1ull << 31) && graph_us < (1ull << 31)) {
        double fk = (double)kernel_us / (double)(kernel_us + graph_us);
        double fg = 1.0 - fk;
        kernel_gain = fk / (fk * fk + fg * fg);
        graph_gain = fg / (fk * fk + fg * fg);
    }
    correct(d, GS_LAUNCH_KERNEL, kernel_gain, measured, target);
    correct(d, GS_LAUNCH_GRAPH, graph_gain, measured, target);
}

static void *sampler(void *arg) {
    (void)arg;
    __typeof__(&nvmlInit_v2) init = (__typeof__(&nvmlInit_v2))gs_real_nvml(GS_FN_nvmlInit_v2);
    __typeof__(&nvmlDeviceGetHandleByIndex_v2) get_handle =
        (__typeof__(&nvmlDeviceGetHandleByIndex_v2))gs_real_nvml(GS_FN_nvmlDeviceGetHandleByIndex_v2);
    if (init == NULL || get_handle == NULL || init() != NVML_SUCCESS) {
        fprintf(stderr, "gpushare: NVML unavailable: compute limit uses the fixed launch cost "
                        "estimate\n");
        return NULL;
    }
    nvmlDevice_t handles[GS_MAX_DEVICES];
    int count = 0;
    while (count < GS_MAX_DEVICES && get_handle((unsigned)count, &handles[count]) == NVML_SUCCESS) {
        count++;
    }
    for (;;) {
        sleep_ns(SAMPLE_NS);
        for (int i = 0; i < count; i++) {
            adapt(i, handles[i]);
        }
    }
    return NULL;
}

static void start_sampler(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&sampler_started, &expected, 1)) {
        return;
    }
    pthread_attr_t attr;
    pthread_t thread;
    if (pthread_attr_init(&attr) != 0) {
        return;
    }
    if (pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) != 0 ||
        pthread_create(&thread, &attr, sampler, NULL) != 0) {
        fprintf(stderr, "gpushare: cannot start the utilisation sampler: compute limit uses the "
                        "fixed launch cost estimate\n");
    }
    (void)pthread_attr_destroy(&attr);
}

/* ---- the bucket ----------------------------------------------------------------------- */

void gs_limiter_start(unsigned core_limit_percent) {
    share_percent = core_limit_percent;
    atomic_store_explicit(&limiter_on, core_limit_percent != 0, memory_order_release);
}

int gs_limiter_active(void) { return atomic_load_explicit(&limiter_on, memory_order_acquire); }

void gs_limiter_fork_child(void) { atomic_store(&sampler_started, 0); }

void gs_limiter_charge(enum gs_launch_kind kind) {
    if (!gs_limiter_active()) {
        return;
    }
    if (atomic_load_explicit(&sampler_started, memory_order_relaxed) == 0) {
        start_sampler();
    }
    struct gs_state_device *d = gs_state_device(gs_current_device());
    if (d == NULL) {
        return;
    }
    uint64_t cost = cost_of(d, kind);
    uint64_t us = cost / 1000;
    atomic_fetch_add_explicit(&d->charged_mix, kind == GS_LAUNCH_GRAPH ? us << 32 : us,
                              memory_order_relaxed);
    uint64_t interval = cost * 100 / share_percent;
    for (;;) {
        uint64_t now = now_ns();
        uint64_t tat = atomic_load_explicit(&d->launch_tat_ns, memory_order_relaxed);
        uint64_t start = tat > now ? tat : now;
        if (start - now > BURST_NS) {
            atomic_store_explicit(&d->throttled_at_ns, now, memory_order_relaxed);
            sleep_ns(start - now - BURST_NS);
            continue;
        }
        if (atomic_compare_exchange_weak_explicit(&d->launch_tat_ns, &tat, start + interval,
                                                  memory_order_acq_rel, memory_order_relaxed)) {
            return;
        }
    }
}
