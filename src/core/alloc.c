// alloc.c: aligned allocation and the per-step scratch arena. Calls libc. Called by every layer.
#include "core/core.h"

#include <stdlib.h>

void *ds_aligned_alloc(size_t align, size_t size) {
    size_t rounded = (size + align - 1) / align * align;
    if (rounded < size) {
        return NULL;
    }
    return aligned_alloc(align, rounded ? rounded : align);
}

void ds_aligned_free(void *p) {
    free(p);
}

dspec_status ds_arena_init(ds_arena *a, size_t size, dspec_err *err) {
    a->base = ds_aligned_alloc(64, size);
    a->size = size;
    a->used = 0;
    a->peak = 0;
    if (!a->base) {
        return ds_err_set(err, DSPEC_ERR_NOMEM, "arena: cannot allocate %zu bytes", size);
    }
    return DSPEC_OK;
}

void ds_arena_deinit(ds_arena *a) {
    ds_aligned_free(a->base);
    a->base = NULL;
    a->size = a->used = 0;
}

void *ds_arena_alloc(ds_arena *a, size_t size, size_t align) {
    size_t start = (a->used + align - 1) & ~(align - 1);
    DS_ASSERT(start >= a->used && start + size >= start && start + size <= a->size);
    a->used = start + size;
    if (a->used > a->peak) {
        a->peak = a->used;
    }
    return a->base + start;
}
