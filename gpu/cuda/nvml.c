/* gpu/cuda/nvml.c — NVML through dlopen. Contract in nvml.h.
 *
 * The few NVML types and entry points used here come from <nvml.h> where the
 * build host has it, else from the declarations below (the ABI of these
 * entry points has been stable since the _v2 variants appeared). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "gpu/cuda/nvml.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#if defined(__has_include) && !defined(SF_NVML_OWN_DECLS)
#if __has_include(<nvml.h>)
#include <nvml.h>
#define SF_HAVE_NVML_H 1
#endif
#endif

#ifndef SF_HAVE_NVML_H
typedef int nvmlReturn_t; /* an enum in nvml.h: int-sized */
#define NVML_SUCCESS 0
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlUtilization_st {
    unsigned int gpu;    /* percent of the sample period a kernel ran */
    unsigned int memory; /* percent of it device memory was read or written */
} nvmlUtilization_t;
typedef struct nvmlMemory_st {
    unsigned long long total, free, used; /* bytes */
} nvmlMemory_t;
#endif

typedef nvmlReturn_t (*fn_init)(void);
typedef nvmlReturn_t (*fn_count)(unsigned int *);
typedef nvmlReturn_t (*fn_by_index)(unsigned int, nvmlDevice_t *);
typedef nvmlReturn_t (*fn_by_bus)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*fn_util)(nvmlDevice_t, nvmlUtilization_t *);
typedef nvmlReturn_t (*fn_mem)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*fn_power)(nvmlDevice_t, unsigned int *);
typedef nvmlReturn_t (*fn_name)(nvmlDevice_t, char *, unsigned int);
typedef const char *(*fn_errstr)(nvmlReturn_t);

static struct {
    int ok;
    char why[160];
    fn_count count;
    fn_by_index by_index;
    fn_by_bus by_bus;
    fn_util util;
    fn_mem mem;
    fn_power power;
    fn_name name;
    fn_errstr errstr;
} g_nvml;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void *sym(void *lib, const char *name, int *missing)
{
    void *p = dlsym(lib, name);
    if (!p && !*missing) {
        *missing = 1;
        snprintf(g_nvml.why, sizeof g_nvml.why, "libnvidia-ml.so.1 has no %s", name);
    }
    return p;
}

static void nvml_load(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(g_nvml.why, sizeof g_nvml.why, "dlopen(libnvidia-ml.so.1): %s", e ? e : "failed");
        return;
    }
    int missing = 0;
    /* dlsym returns object pointers; POSIX guarantees they convert to
     * function pointers (through a union: no cast warning). The pointers are
     * used only once g_nvml.ok is set. */
#define LOAD(var, name)                                                                            \
    do {                                                                                           \
        union {                                                                                    \
            void *p;                                                                               \
            __typeof__(var) f;                                                                     \
        } u_ = {sym(lib, name, &missing)};                                                         \
        var = u_.f;                                                                                \
    } while (0)
    fn_init init = NULL;
    LOAD(init, "nvmlInit_v2");
    LOAD(g_nvml.count, "nvmlDeviceGetCount_v2");
    LOAD(g_nvml.by_index, "nvmlDeviceGetHandleByIndex_v2");
    LOAD(g_nvml.by_bus, "nvmlDeviceGetHandleByPciBusId_v2");
    LOAD(g_nvml.util, "nvmlDeviceGetUtilizationRates");
    LOAD(g_nvml.mem, "nvmlDeviceGetMemoryInfo");
    LOAD(g_nvml.power, "nvmlDeviceGetPowerUsage");
    LOAD(g_nvml.name, "nvmlDeviceGetName");
#undef LOAD
    {
        union {
            void *p;
            fn_errstr f;
        } u = {dlsym(lib, "nvmlErrorString")}; /* optional */
        g_nvml.errstr = u.f;
    }
    if (missing) {
        dlclose(lib);
        return;
    }
    nvmlReturn_t r = init();
    if (r != NVML_SUCCESS) {
        snprintf(g_nvml.why, sizeof g_nvml.why, "nvmlInit_v2: %s (%d)", g_nvml.errstr ? g_nvml.errstr(r) : "error",
                 (int)r);
        dlclose(lib);
        return;
    }
    /* Initialised for the life of the process: the library stays loaded. */
    g_nvml.why[0] = '\0';
    g_nvml.ok = 1;
}

const char *sf_nvml_error(void)
{
    pthread_once(&g_once, nvml_load);
    return g_nvml.why;
}

int sf_nvml_device_stats(const char *pci_bus_id, sf_device_stats *out)
{
    if (!out)
        return -1;
    memset(out, 0, sizeof *out);
    pthread_once(&g_once, nvml_load);
    if (!g_nvml.ok)
        return -1;
    nvmlDevice_t dev = NULL;
    if (!pci_bus_id || !pci_bus_id[0] || g_nvml.by_bus(pci_bus_id, &dev) != NVML_SUCCESS) {
        /* No bus id match: only an unambiguous single device will do. */
        unsigned int n = 0;
        dev = NULL;
        if (g_nvml.count(&n) != NVML_SUCCESS || n != 1 || g_nvml.by_index(0, &dev) != NVML_SUCCESS)
            return -1;
    }
    nvmlMemory_t mem;
    memset(&mem, 0, sizeof mem);
    if (g_nvml.mem(dev, &mem) != NVML_SUCCESS)
        return -1;
    out->memory_total_bytes = (double)mem.total;
    out->memory_used_bytes = (double)mem.used;
    nvmlUtilization_t u;
    memset(&u, 0, sizeof u);
    out->utilization_ratio = g_nvml.util(dev, &u) == NVML_SUCCESS ? (double)u.gpu / 100.0 : -1.0;
    unsigned int mw = 0;
    out->power_watts = g_nvml.power(dev, &mw) == NVML_SUCCESS ? (double)mw / 1000.0 : -1.0;
    char name[96];
    if (g_nvml.name(dev, name, (unsigned int)sizeof name) == NVML_SUCCESS) {
        name[sizeof name - 1] = '\0';
        size_t l = strlen(name);
        if (l >= sizeof out->name)
            l = sizeof out->name - 1;
        memcpy(out->name, name, l);
        out->name[l] = '\0';
    }
    out->valid = 1;
    return 0;
}
