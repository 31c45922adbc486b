/*
 * Limits. A read-only key=value file at GPUSHARE_LIMITS_PATH is authoritative; only when it
 * does not exist are the GPUSHARE_* environment variables read (so a tenant cannot raise a
 * limit the node set). Any malformed file or value is an error: the caller then refuses every
 * allocation rather than run unprotected.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpushare.h"

#ifndef GPUSHARE_LIMITS_PATH
#define GPUSHARE_LIMITS_PATH "/etc/gpushare/limits.conf"
#endif
#define GS_DEFAULT_STATE_DIR "/var/run/gpushare"
#define GS_MAX_FILE 65536

static const char *limits_path(void) {
#ifdef GPUSHARE_TESTING
    const char *override = getenv("GPUSHARE_TEST_LIMITS_PATH");
    if (override != NULL && override[0] != '\0') {
        return override;
    }
#endif
    return GPUSHARE_LIMITS_PATH;
}

int gs_parse_bytes(const char *text, uint64_t *out) {
    const char *p = text;
    while (*p == ' ' || *p == '\t') {
        p++;
    }
    if (!isdigit((unsigned char)*p)) {
        return -1;
    }
    uint64_t value = 0;
    while (isdigit((unsigned char)*p)) {
        unsigned digit = (unsigned)(*p - '0');
        if (value > (UINT64_MAX - digit) / 10) {
            return -1;
        }
        value = value * 10 + digit;
        p++;
    }
    while (*p == ' ' || *p == '\t') {
        p++;
    }
    static const struct {
        const char *suffix;
        uint64_t factor;
    } units[] = {
        {"", 1},
        {"B", 1},
        {"K", 1ull << 10},
        {"Ki", 1ull << 10},
        {"KiB", 1ull << 10},
        {"KB", 1000ull},
        {"M", 1ull << 20},
        {"Mi", 1ull << 20},
        {"MiB", 1ull << 20},
        {"MB", 1000000ull},
        {"G", 1ull << 30},
        {"Gi", 1ull << 30},
        {"GiB", 1ull << 30},
        {"GB", 1000000000ull},
        {"T", 1ull << 40},
        {"Ti", 1ull << 40},
        {"TiB", 1ull << 40},
        {"TB", 1000000000000ull},
    };
    size_t len = strlen(p);
    while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t')) {
        len--;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].suffix) == len && strncmp(p, units[i].suffix, len) == 0) {
            if (value > UINT64_MAX / units[i].factor) {
                return -1;
            }
            *out = value * units[i].factor;
            return 0;
        }
    }
    return -1;
}

void gs_format_bytes(uint64_t bytes, char *buf, size_t size) {
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int unit = 0;
    double value = (double)bytes;
    while (value >= 1024.0 && unit < 4) {
        value /= 1024.0;
        unit++;
    }
    if (unit == 0) {
        snprintf(buf, size, "%llu B", (unsigned long long)bytes);
    } else {
        snprintf(buf, size, "%.1f %s", value, names[unit]);
    }
}

static void complain(const char *source, const char *key, const char *problem) {
    fprintf(stderr, "gpushare: %s: %s: %s; refusing GPU allocations in this process\n", source,
            key, problem);
}

static int parse_percent(const char *text, unsigned *out) {
    uint64_t value;
    if (gs_parse_bytes(text, &value) != 0 || value > 100) {
        return -1;
    }
    for (const char *p = text; *p != '\0'; p++) {
        if (!isdigit((unsigned char)*p) && *p != ' ' && *p != '\t') {
            return -1; /* no unit suffixes on a percentage */
        }
    }
    *out = (unsigned)value;
    return 0;
}

/* Applies one key=value; source names the file or "environment" for messages. */
static int apply(struct gs_config *config, const char *source, const char *key,
                 const char *value) {
    if (strcmp(key, "memory_limit_bytes") == 0) {
        if (gs_parse_bytes(value, &config->default_limit) != 0 || config->default_limit == 0) {
            complain(source, key, "not a positive byte count (e.g. 10GiB, 512MiB, 1073741824)");
            return -1;
        }
        return 0;
    }
    if (strncmp(key, "memory_limit_bytes.", 19) == 0) {
        const char *index_text = key + 19;
        char *end = NULL;
        errno = 0;
        long index = strtol(index_text, &end, 10);
        if (index_text[0] == '\0' || !isdigit((unsigned char)index_text[0]) || *end != '\0' ||
            errno != 0 || index < 0 || index >= GS_MAX_DEVICES) {
            complain(source, key, "device index must be 0..15");
            return -1;
        }
        uint64_t limit;
        if (gs_parse_bytes(value, &limit) != 0 || limit == 0) {
            complain(source, key, "not a positive byte count (e.g. 10GiB, 512MiB, 1073741824)");
            return -1;
        }
        config->device_limit[index] = limit;
        return 0;
    }
    if (strcmp(key, "core_limit_percent") == 0) {
        if (parse_percent(value, &config->core_limit_percent) != 0) {
            complain(source, key, "not an integer percentage 0..100");
            return -1;
        }
        if (config->core_limit_percent == 100) {
            config->core_limit_percent = 0;
        }
        return 0;
    }
    if (strcmp(key, "context_overhead_bytes") == 0) {
        if (gs_parse_bytes(value, &config->ctx_overhead) != 0) {
            complain(source, key, "not a byte count");
            return -1;
        }
        return 0;
    }
    if (strcmp(key, "state_dir") == 0) {
        if (value[0] != '/' || strlen(value) >= sizeof config->state_dir) {
            complain(source, key, "must be an absolute path");
            return -1;
        }
        snprintf(config->state_dir, sizeof config->state_dir, "%s", value);
        return 0;
    }
    if (strcmp(key, "oom_policy") == 0) {
        if (strcmp(value, "fail") == 0) {
            config->oom_policy = GS_OOM_FAIL;
        } else if (strcmp(value, "exit") == 0) {
            config->oom_policy = GS_OOM_EXIT;
        } else {
            complain(source, key, "must be 'fail' or 'exit'");
            return -1;
        }
        return 0;
    }
    complain(source, key, "unknown key");
    return -1;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r') {
        s++;
    }
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == '\r')) {
        s[--len] = '\0';
    }
    return s;
}

static int load_file(struct gs_config *config, const char *path, int fd) {
    static char text[GS_MAX_FILE + 1];
    size_t length = 0;
    for (;;) {
        ssize_t n = read(fd, text + length, GS_MAX_FILE - length);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            complain(path, "(file)", strerror(errno));
            return -1;
        }
        if (n == 0) {
            break;
        }
        length += (size_t)n;
        if (length == GS_MAX_FILE) {
            complain(path, "(file)", "larger than 64 KiB");
            return -1;
        }
    }
    text[length] = '\0';
    char *save = NULL;
    int line_no = 0;
    for (char *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        char *body = trim(line);
        if (body[0] == '\0' || body[0] == '#') {
            continue;
        }
        char *eq = strchr(body, '=');
        if (eq == NULL) {
            char where[64];
            snprintf(where, sizeof where, "line %d", line_no);
            complain(path, where, "expected key=value");
            return -1;
        }
        *eq = '\0';
        if (apply(config, path, trim(body), trim(eq + 1)) != 0) {
            return -1;
        }
    }
    return 0;
}

static int load_env(struct gs_config *config) {
    static const struct {
        const char *env;
        const char *key;
    } plain[] = {
        {"GPUSHARE_MEM_LIMIT", "memory_limit_bytes"},
        {"GPUSHARE_CORE_LIMIT", "core_limit_percent"},
        {"GPUSHARE_STATE_DIR", "state_dir"},
        {"GPUSHARE_OOM_POLICY", "oom_policy"},
        {"GPUSHARE_CONTEXT_OVERHEAD", "context_overhead_bytes"},
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        const char *value = getenv(plain[i].env);
        if (value != NULL && value[0] != '\0' &&
            apply(config, plain[i].env, plain[i].key, value) != 0) {
            return -1;
        }
    }
    for (int index = 0; index < GS_MAX_DEVICES; index++) {
        char env[64];
        char key[64];
        snprintf(env, sizeof env, "GPUSHARE_MEM_LIMIT_%d", index);
        snprintf(key, sizeof key, "memory_limit_bytes.%d", index);
        const char *value = getenv(env);
        if (value != NULL && value[0] != '\0' && apply(config, env, key, value) != 0) {
            return -1;
        }
    }
    return 0;
}

int gs_config_load(struct gs_config *config) {
    memset(config, 0, sizeof *config);
    config->ctx_overhead = GS_DEFAULT_CTX_OVERHEAD;
    snprintf(config->state_dir, sizeof config->state_dir, "%s", GS_DEFAULT_STATE_DIR);
    const char *path = limits_path();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        config->from_file = 1;
        int rc = load_file(config, path, fd);
        if (close(fd) != 0 && rc == 0) {
            complain(path, "(file)", strerror(errno));
            rc = -1;
        }
        return rc;
    }
    if (errno != ENOENT) {
        /* Exists but unreadable: never fall back to the tenant's environment. */
        complain(path, "(file)", strerror(errno));
        return -1;
    }
    return load_env(config);
}

uint64_t gs_config_limit(const struct gs_config *config, int device) {
    if (device < 0 || device >= GS_MAX_DEVICES) {
        return 0;
    }
    return config->device_limit[device] != 0 ? config->device_limit[device]
                                             : config->default_limit;
}
