/* Counts the graph runs of a process that uses ggml, and the time spent in them: preloaded
 * (LD_PRELOAD) into a server under bench/vs_llama_server.py --count-graphs.
 *
 * llama_decode splits a batch into micro-batches and runs one graph each through
 * ggml_backend_sched_graph_compute_async; this wraps that function. Two 64-bit counters (graphs,
 * nanoseconds inside them) live in the file named by GRAPH_COUNTER_FILE, mapped shared, so the
 * bench reads them before and after a turn without signalling the server.
 *
 *   cc -O2 -shared -fPIC -o graph_counter.so graph_counter.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int (*compute_fn)(void *sched, void *graph);

static volatile uint64_t *counters; /* [graphs, ns] */
static compute_fn real_compute;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void map_counters(void) {
    const char *path = getenv("GRAPH_COUNTER_FILE");
    int fd = path ? open(path, O_RDWR | O_CREAT, 0644) : -1;
    if (fd < 0 || ftruncate(fd, 2 * sizeof(uint64_t)) != 0) {
        return;
    }
    void *p = mmap(NULL, 2 * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    counters = p == MAP_FAILED ? NULL : (volatile uint64_t *)p;
}

static compute_fn find_real(void) {
    compute_fn f = (compute_fn)dlsym(RTLD_NEXT, "ggml_backend_sched_graph_compute_async");
    if (f == NULL) { /* ggml loaded later with RTLD_LOCAL (Python's ctypes): ask the library itself */
        void *lib = dlopen("libggml-base.so.0", RTLD_NOW | RTLD_NOLOAD);
        f = lib ? (compute_fn)dlsym(lib, "ggml_backend_sched_graph_compute_async") : NULL;
    }
    return f;
}

int ggml_backend_sched_graph_compute_async(void *sched, void *graph) {
    if (real_compute == NULL) {
        real_compute = find_real();
        if (real_compute == NULL) {
            fprintf(stderr, "graph_counter: ggml_backend_sched_graph_compute_async not found\n");
            abort();
        }
        map_counters();
    }
    uint64_t start = now_ns();
    int status = real_compute(sched, graph);
    if (counters != NULL) { /* (one thread runs a context's graphs) */
        counters[0] += 1;
        counters[1] += now_ns() - start;
    }
    return status;
}
