// dspec.h: the public C API of libdspec, a Qwen3.5-family inference engine with block-diffusion
// speculative decoding. It may call nothing; every layer under src/ implements a part of it.
// Spec: ../shared/spec/DESIGN.md §2-3. This is the only public header.
//
// Usage (grows with the engine):
//     dspec_err err;
//     if (dspec_init(&err) != DSPEC_OK) { fprintf(stderr, "%s\n", err.msg); }
//
// Rules: every call that can fail returns dspec_status and takes `dspec_err *err` last (NULL allowed);
// on failure err->msg says what failed, where, and expected vs got. The library never writes to
// stdout and reads no environment variables; logging goes to the sink set by dspec_set_log.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSPEC_VERSION_MAJOR 0
#define DSPEC_VERSION_MINOR 1
#define DSPEC_VERSION_PATCH 0
#define DSPEC_VERSION_STRING "0.1.0"

typedef enum dspec_status {
    DSPEC_OK = 0,
    DSPEC_ERR_INVALID = 1,     // bad argument or flag
    DSPEC_ERR_FORMAT = 2,      // malformed file or data
    DSPEC_ERR_IO = 3,          // open/read/write/mmap failed
    DSPEC_ERR_NOMEM = 4,       // allocation failed (message gives the numbers)
    DSPEC_ERR_UNSUPPORTED = 5, // valid input we do not handle (yet)
    DSPEC_ERR_DEVICE = 6,      // accelerator error
    DSPEC_ERR_CANCELED = 7,    // stopped by the caller
} dspec_status;

#define DSPEC_ERR_MSG_LEN 256

typedef struct dspec_err {
    dspec_status code;
    char msg[DSPEC_ERR_MSG_LEN];
} dspec_err;

typedef enum dspec_log_level {
    DSPEC_LOG_ERROR = 0,
    DSPEC_LOG_WARN = 1,
    DSPEC_LOG_INFO = 2,
    DSPEC_LOG_DEBUG = 3,
} dspec_log_level;

// Log sink: receives one formatted line (no trailing newline). NULL restores the stderr default.
typedef void (*dspec_log_fn)(dspec_log_level level, const char *line, void *user);

// Sets the log sink and the most verbose level that is emitted. Thread-safe.
void dspec_set_log(dspec_log_fn fn, void *user, dspec_log_level max_level);

// Name of a status code ("DSPEC_ERR_FORMAT"); never NULL.
const char *dspec_status_name(dspec_status s);

// Version string of the library ("0.1.0").
const char *dspec_version(void);

#ifdef __cplusplus
}
#endif
