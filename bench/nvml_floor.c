/* The floor the hook is measured against: what NVML itself costs for one admission decision
 * (load the library, nvmlInit, GPU 0's handle, memory info, its process list, shutdown).
 * Built with the system compiler, no NVML headers: gcc -O2 -o nvml_floor nvml_floor.c -ldl
 * With an argument N it times N rounds in-process and prints the medians in microseconds. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_t;
typedef int (*init_f)(void);
typedef int (*handle_f)(unsigned int, void **);
typedef int (*mem_f)(void *, mem_t *);
typedef int (*procs_f)(void *, unsigned int *, proc_t *);

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    double *t_init = calloc(rounds, sizeof(double)), *t_query = calloc(rounds, sizeof(double));
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    init_f init = (init_f)dlsym(lib, "nvmlInit_v2");
    init_f shutdown = (init_f)dlsym(lib, "nvmlShutdown");
    handle_f handle = (handle_f)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    mem_f mem = (mem_f)dlsym(lib, "nvmlDeviceGetMemoryInfo");
    procs_f procs = (procs_f)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    for (int r = 0; r < rounds; r++) {
        double a = now_us();
        if (init()) { fprintf(stderr, "nvmlInit failed\n"); return 1; }
        double b = now_us();
        void *dev; mem_t m; proc_t p[64]; unsigned int n = 64;
        handle(0, &dev);
        mem(dev, &m);
        procs(dev, &n, p);
        double c = now_us();
        shutdown();
        t_init[r] = b - a;
        t_query[r] = c - b;
    }
    if (argc > 1) {
        qsort(t_init, rounds, sizeof(double), cmp);
        qsort(t_query, rounds, sizeof(double), cmp);
        printf("nvml_init_us_median %.0f\nnvml_queries_us_median %.0f\n", t_init[rounds / 2], t_query[rounds / 2]);
    }
    return 0;
}
