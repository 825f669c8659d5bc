/* What _fast_stats exports to other extensions, through the capsule `msprobe_lite.core._fast_stats._C_API`. */
#ifndef MSPROBE_LITE_FAST_STATS_H
#define MSPROBE_LITE_FAST_STATS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FAST_STATS_CAPSULE "msprobe_lite.core._fast_stats._C_API"

/* one_pass() flag: release the GIL for large inputs, safe only when no other thread can free or resize the
   memory meanwhile. */
#define STATS_MAY_RELEASE 1

typedef struct {
    /* Max, Min, Mean, Norm into `out`; 1 when the values are all finite, 0 when not. kind: 0 float32,
       1 float64, 2 bfloat16 (raw 2-byte items). Called with the GIL held; `flags` as above. */
    int (*one_pass)(const char *base, Py_ssize_t rows, Py_ssize_t run, Py_ssize_t stride, int kind,
                    int flags, double out[4]);
    /* A new Stats (see _fast_stats.c) holding `values`; NULL with an exception set on failure. */
    PyObject *(*new_stats)(const double values[4]);
    /* The Stats type, for readers that take its doubles directly (core/_fast_json.c). */
    PyTypeObject *stats_type;
} FastStatsApi;

/* The layout of a Stats object: readers that hold stats_type may read `values` in place. */
typedef struct {
    PyObject_HEAD
    double values[4];
} StatsObject;

/* The API of _fast_stats, imported (NULL with an exception set when it cannot be). PyCapsule_Import alone
   finds the submodule only once something has imported it, so it is imported here first. */
static inline FastStatsApi *import_fast_stats(void) {
    PyObject *module = PyImport_ImportModule("msprobe_lite.core._fast_stats");
    FastStatsApi *api = module ? (FastStatsApi *)PyCapsule_Import(FAST_STATS_CAPSULE, 0) : NULL;
    Py_XDECREF(module);
    return api;
}

/* A bfloat16 item (the high half of a float32) as the float32 it stands for. */
static inline float bf16_to_float(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float out;
    memcpy(&out, &wide, sizeof out);
    return out;
}

#endif
