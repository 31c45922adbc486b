/*
 * Layout of the shared state file <state_dir>/gpushare.state (version 1). Documented in
 * docs/isolation.md; any change to it must bump GS_STATE_VERSION.
 *
 *   offset 0      struct gs_state_header        (64 bytes)
 *   offset 64     struct gs_state_device[16]    (64 bytes each)
 *   offset 1088   struct gs_state_slot[256]     (144 bytes each)
 *
 * All fields are little-endian native integers; every field written after publication is a
 * lock-free 64-bit atomic, so the file can be shared between processes through MAP_SHARED.
 */
#ifndef GPUSHARE_STATE_H
#define GPUSHARE_STATE_H

#include <stdatomic.h>
#include <stdint.h>

#include "gpushare.h"

#define GS_STATE_MAGIC 0x3145544154534753ull /* "GSSTATE1" read as little-endian bytes */
#define GS_STATE_VERSION 1u
#define GS_STATE_SLOTS 256u
#define GS_STATE_FILE "gpushare.state"

/* Slot tag: 0 = free; otherwise the owner's pid in bits 0..31 plus state bits. */
#define GS_SLOT_CLAIMING (1ull << 62)
#define GS_SLOT_RECLAIMING (1ull << 63)
#define GS_SLOT_PID_MASK 0xffffffffull

struct gs_state_header {
    _Atomic uint64_t magic; /* written last by the creator, release; 0 until initialised */
    uint32_t version;
    uint32_t header_size; /* sizeof(struct gs_state_header) */
    uint32_t device_count;
    uint32_t slot_count;
    uint32_t slot_size;
    uint32_t device_size;
    uint64_t file_size;
    uint64_t created_unix_ns;
    /* Formerly reserved (zero in every file, so version 1 still): allocations refused against
     * the limit since the file was created, all devices and processes (read by the monitor). */
    _Atomic uint64_t refused_allocations;
    uint64_t reserved;
};

struct gs_state_device {
    _Atomic uint64_t limit; /* informational: the creator's limit for this index (0: none) */
    _Atomic uint64_t used;  /* bytes charged by all processes; reserve by CAS */
    /* Compute throttle (limiter.c), CLOCK_MONOTONIC nanoseconds: */
    _Atomic uint64_t launch_tat_ns;  /* GCRA theoretical arrival time of the next launch */
    _Atomic uint64_t launch_cost_ns; /* estimated GPU time of one launch (0: not yet known) */
    _Atomic uint64_t adapted_at_ns;  /* last feedback step (one process per period wins) */
    _Atomic uint64_t throttled_at_ns; /* last time a launch had to wait */
    /* Formerly reserved (zero in every file, so version 1 still): */
    _Atomic uint64_t graph_cost_ns; /* estimated GPU time of one graph launch (0: not yet known) */
    /* Estimated GPU time charged since the last feedback step, microseconds: kernel launches in
     * bits 0..31, graph launches in bits 32..63 (one fetch_add per launch, reset by the step). */
    _Atomic uint64_t charged_mix;
};

struct gs_state_slot {
    _Atomic uint64_t tag;        /* see GS_SLOT_* */
    _Atomic uint64_t start_time; /* field 22 of /proc/<pid>/stat (clock ticks since boot) */
    _Atomic uint64_t used[GS_MAX_DEVICES];
};

struct gs_state_file {
    struct gs_state_header header;
    struct gs_state_device devices[GS_MAX_DEVICES];
    struct gs_state_slot slots[GS_STATE_SLOTS];
};

_Static_assert(sizeof(struct gs_state_header) == 64, "header layout");
_Static_assert(sizeof(struct gs_state_device) == 64, "device layout");
_Static_assert(sizeof(struct gs_state_slot) == 144, "slot layout");

#endif /* GPUSHARE_STATE_H */
