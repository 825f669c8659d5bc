/* One pass over a tensor's values for all four statistics (Max, Min, Mean, Norm).

Why C: the library route makes three or four passes (max, min, sum, sum of squares), each a separate call with
its own dispatch. For the many small tensors of a training step the calls cost more than the arithmetic; for
large ones the passes over memory do. Here one loop keeps 16 independent lanes per statistic, which the
compiler turns into SIMD code without changing the order of operations it was given (no -ffast-math).

Accuracy: float32 and bfloat16 values accumulate in float32 lanes for a block of 4096 values, then each
block's lane sums are added in double. That is the spec's "low-precision floats accumulate in float32" with
the error of a 4096-value float32 sum, not of the whole tensor's (numpy's float32 dot product, the fallback,
accumulates the whole tensor in float32). float64 accumulates in double.

Non-finite data (NaN, infinities) and values whose squares overflow a float32 lane are not handled here: the
result is None and the caller takes the exact library route, which knows the spec's rules for them. The
comparisons below ignore NaN, so a NaN would not show in Max/Min; it always shows in the sums.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
#define BLOCK 4096
#define RELEASE_GIL_FROM (1 << 16) /* bytes: below this, releasing the GIL costs more than the loop */

/* One build, the best instructions of the machine it runs on: GCC/Clang on x86-64 Linux compile each marked
   function for AVX2 and for the baseline and pick one when the module loads. Elsewhere (aarch64: NEON is
   the baseline) the plain build is already vectorised. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

typedef struct {
    double max, min, sum, squares;
} stats_t;

static inline float bf16_to_float(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float out;
    memcpy(&out, &wide, sizeof out);
    return out;
}

/* LOAD(i) reads value i as ACC (the lane type). */
#define KERNEL(NAME, ELEM, ACC, LOAD)                                                                 \
    CLONES static void NAME(const ELEM *x, Py_ssize_t n, stats_t *out) {                             \
        ACC hi[LANES], lo[LANES];                                                                     \
        for (int j = 0; j < LANES; j++) {                                                             \
            hi[j] = -INFINITY;                                                                        \
            lo[j] = INFINITY;                                                                         \
        }                                                                                             \
        double sum = 0.0, squares = 0.0;                                                              \
        Py_ssize_t i = 0;                                                                             \
        while (i + LANES <= n) {                                                                      \
            Py_ssize_t end = i + BLOCK < n ? i + BLOCK : n;                                           \
            ACC s[LANES], q[LANES];                                                                   \
            for (int j = 0; j < LANES; j++) {                                                         \
                s[j] = 0;                                                                             \
                q[j] = 0;                                                                             \
            }                                                                                         \
            for (; i + LANES <= end; i += LANES) {                                                    \
                for (int j = 0; j < LANES; j++) {                                                     \
                    ACC a = LOAD(i + j);                                                              \
                    hi[j] = a > hi[j] ? a : hi[j];                                                    \
                    lo[j] = a < lo[j] ? a : lo[j];                                                    \
                    s[j] += a;                                                                        \
                    q[j] += a * a;                                                                    \
                }                                                                                     \
            }                                                                                         \
            for (int j = 0; j < LANES; j++) {                                                         \
                sum += s[j];                                                                          \
                squares += q[j];                                                                      \
            }                                                                                         \
        }                                                                                             \
        ACC top = -INFINITY, bottom = INFINITY;                                                       \
        for (int j = 0; j < LANES; j++) {                                                             \
            top = hi[j] > top ? hi[j] : top;                                                          \
            bottom = lo[j] < bottom ? lo[j] : bottom;                                                 \
        }                                                                                             \
        for (; i < n; i++) {                                                                          \
            ACC a = LOAD(i);                                                                          \
            top = a > top ? a : top;                                                                  \
            bottom = a < bottom ? a : bottom;                                                         \
            sum += a;                                                                                 \
            squares += (double)a * a;                                                                 \
        }                                                                                             \
        out->max = top;                                                                               \
        out->min = bottom;                                                                            \
        out->sum = sum;                                                                               \
        out->squares = squares;                                                                       \
    }

#define LOAD_PLAIN(k) x[k]
#define LOAD_BF16(k) bf16_to_float(x[k])
KERNEL(stats_f32, float, float, LOAD_PLAIN)
KERNEL(stats_f64, double, double, LOAD_PLAIN)
KERNEL(stats_bf16, uint16_t, float, LOAD_BF16)

static const char *KINDS[] = {"float32", "float64", "bfloat16"};
static const Py_ssize_t ITEM_SIZES[] = {4, 8, 2};

static PyObject *stats(PyObject *self, PyObject *args) {
    Py_buffer view;
    const char *kind_name;
    if (!PyArg_ParseTuple(args, "y*s:stats", &view, &kind_name))
        return NULL;
    int kind = -1;
    for (int k = 0; k < 3; k++)
        if (strcmp(kind_name, KINDS[k]) == 0)
            kind = k;
    if (kind < 0 || view.len == 0 || view.len % ITEM_SIZES[kind] != 0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError,
                     "stats(): expected a non-empty contiguous buffer of float32, float64 or bfloat16 "
                     "(2-byte) items and its kind, got %zd bytes of kind '%s'",
                     view.len, kind_name);
        return NULL;
    }
    Py_ssize_t n = view.len / ITEM_SIZES[kind];
    stats_t r;
    int release = view.len >= RELEASE_GIL_FROM;
    PyThreadState *state = release ? PyEval_SaveThread() : NULL;
    if (kind == 0)
        stats_f32((const float *)view.buf, n, &r);
    else if (kind == 1)
        stats_f64((const double *)view.buf, n, &r);
    else
        stats_bf16((const uint16_t *)view.buf, n, &r);
    if (release)
        PyEval_RestoreThread(state);
    PyBuffer_Release(&view);
    if (!isfinite(r.sum) || !isfinite(r.squares))
        Py_RETURN_NONE; /* NaN, an infinity, or a float32 lane overflowed: the exact route decides */
    return Py_BuildValue("(dddd)", r.max, r.min, r.sum / (double)n, sqrt(r.squares));
}

static PyMethodDef METHODS[] = {
    {"stats", stats, METH_VARARGS,
     "stats(buffer, kind) -> (Max, Min, Mean, Norm), or None when the values are not all finite.\n\n"
     "kind: 'float32', 'float64' or 'bfloat16' (a buffer of the 2-byte bfloat16 items)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fast_stats",
                                    "One-pass tensor statistics (see core/statistics.py).", -1, METHODS};

PyMODINIT_FUNC PyInit__fast_stats(void) { return PyModule_Create(&MODULE); }
