// cpu.c: runtime CPU feature detection (cpuid + xgetbv) and the time source. The flags are a
// read-only table initialised once (STYLE.md §2.8). We never build with -march=native: these VMs
// advertise AMX but fault on it, so kernels are compiled per ISA and chosen here at run time.
#include "core/core.h"

#include <stdatomic.h>
#include <threads.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define DS_X86 1
#endif

static ds_cpu_features g_cpu;
static once_flag g_cpu_once = ONCE_FLAG_INIT;
static _Atomic int g_max_level = 2;

#ifdef DS_X86
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static void cpu_detect(void) {
#ifdef DS_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) {
        return;
    }
    bool osxsave = (c >> 27) & 1;
    bool fma = (c >> 12) & 1;
    bool f16c = (c >> 29) & 1;
    bool avx = (c >> 28) & 1;
    if (!osxsave || !avx) {
        return;
    }
    uint64_t xcr0 = xgetbv0();
    bool ymm_ok = (xcr0 & 0x6) == 0x6;
    bool zmm_ok = (xcr0 & 0xe6) == 0xe6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        return;
    }
    bool avx2 = (b >> 5) & 1;
    bool avx512f = (b >> 16) & 1;
    bool avx512dq = (b >> 17) & 1;
    bool avx512bw = (b >> 30) & 1;
    bool avx512vl = (b >> 31) & 1;
    bool vnni = (c >> 11) & 1;
    g_cpu.avx2 = ymm_ok && avx2 && fma && f16c;
    g_cpu.avx512 = g_cpu.avx2 && zmm_ok && avx512f && avx512bw && avx512vl && avx512dq;
    g_cpu.avx512_vnni = g_cpu.avx512 && vnni;
#endif
}

const ds_cpu_features *ds_cpu_get(void) {
    call_once(&g_cpu_once, cpu_detect);
    return &g_cpu;
}

void ds_cpu_set_max_level(int level) {
    atomic_store(&g_max_level, level < 0 ? 0 : level > 2 ? 2 : level);
}

int ds_cpu_max_level(void) {
    const ds_cpu_features *f = ds_cpu_get();
    int hw = f->avx512 ? 2 : f->avx2 ? 1 : 0;
    int lim = atomic_load(&g_max_level);
    return hw < lim ? hw : lim;
}

double ds_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
