/* Helpers for the mock_*.c test programs: expect a result, print key=value lines. */
#ifndef GPUSHARE_MOCK_CHECK_H
#define GPUSHARE_MOCK_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int mock_failures __attribute__((unused));

/* Evaluates `call` once; reports and counts a failure unless it returned `expected`. */
#define EXPECT(call, expected)                                                                \
    do {                                                                                      \
        long long got_ = (long long)(call);                                                   \
        if (got_ != (long long)(expected)) {                                                  \
            fprintf(stderr, "%s:%d: %s returned %lld, expected %lld\n", __FILE__, __LINE__,   \
                    #call, got_, (long long)(expected));                                      \
            mock_failures++;                                                                  \
        }                                                                                     \
    } while (0)

#define EXPECT_TRUE(condition)                                                                \
    do {                                                                                      \
        if (!(condition)) {                                                                   \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition);          \
            mock_failures++;                                                                  \
        }                                                                                     \
    } while (0)

#define KV(key, format, value) printf("%s=" format "\n", key, value)

#define MIB (1024ull * 1024ull)

#endif /* GPUSHARE_MOCK_CHECK_H */
