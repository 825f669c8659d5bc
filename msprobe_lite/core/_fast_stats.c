/* One pass over a tensor's values for all four statistics (Max, Min, Mean, Norm).

Why C: the library route makes three or four passes (max, min, sum, sum of squares), each a separate call with
its own dispatch. For the many small tensors of a training step the calls cost more than the arithmetic; for
large ones the passes over memory do. Here one loop keeps 16 independent lanes per statistic, which the
compiler turns into SIMD code without changing the order of operations it was given (no -ffast-math). It
reads on the calling thread alone: a single pass on one core beats PyTorch's three multi-threaded reductions
(aminmax, sum, norm) on the machines measured (tools/bench_stats.py), and borrowing another library's thread
pool would need its private symbols.

Accuracy: float32 and bfloat16 values accumulate in float32 lanes for a block of 4096 values, then each
block's lane sums are added in double. That is the spec's "low-precision floats accumulate in float32" with
the error of a 4096-value float32 sum, not of the whole tensor's (numpy's float32 dot product, the fallback,
accumulates the whole tensor in float32). float64 accumulates in double.

Non-finite data (NaN, infinities, or a float32 lane sum that overflowed) is not handled here: the result is
None and the caller takes the exact library route, which knows the spec's rules for them. The comparisons
below ignore NaN, so a NaN would not show in Max/Min; it always shows in the sums. Squares that overflow or
underflow their lane (finite values beyond about 1e18 or below 1e-17 in float32) are summed again from the
values divided by the largest magnitude, so Norm stays exact.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_fast_stats.h"
#include "_module.h"

#define LANES 16
#define BLOCK 4096
#define RELEASE_GIL_FROM (1 << 16) /* bytes: below this, releasing the GIL costs more than the loop */

/* One build, the best instructions of the machine it runs on: GCC on x86-64 Linux compiles each marked
   function for AVX2 and for the baseline and picks one when the module loads. Elsewhere (aarch64: NEON is
   the baseline) the plain build is already vectorised. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

typedef struct {
    double max, min, sum, squares;
} stats_t;

/* A kernel feeds runs of contiguous values into 16 lanes per statistic; the float lane sums move into double
   every BLOCK values. A flat buffer is one run; a strided tensor (rows of a slice) is one run per row.
   LOAD(p, k) reads value k of run p as ACC (the lane type). */
#define KERNEL(NAME, ELEM, ACC, LOAD)                                                                 \
    typedef struct {                                                                                  \
        ACC hi[LANES], lo[LANES], s[LANES], q[LANES];                                                 \
        ACC top, bottom;                                                                              \
        double sum, squares;                                                                          \
        Py_ssize_t pending; /* values in the lane sums since they last moved into double */          \
    } NAME##_state;                                                                                   \
    static inline void NAME##_flush(NAME##_state *st) {                                               \
        for (int j = 0; j < LANES; j++) {                                                             \
            st->sum += st->s[j];                                                                      \
            st->squares += st->q[j];                                                                  \
            st->s[j] = 0;                                                                             \
            st->q[j] = 0;                                                                             \
        }                                                                                             \
        st->pending = 0;                                                                              \
    }                                                                                                 \
    CLONES static void NAME##_feed(NAME##_state *st, const ELEM *x, Py_ssize_t n) {                  \
        Py_ssize_t i = 0;                                                                             \
        while (i + LANES <= n) {                                                                      \
            Py_ssize_t room = (BLOCK - st->pending) / LANES * LANES;                                  \
            Py_ssize_t end = i + room < n ? i + room : n;                                             \
            Py_ssize_t start = i;                                                                     \
            ACC hi[LANES], lo[LANES], s[LANES], q[LANES];                                             \
            memcpy(hi, st->hi, sizeof hi);                                                            \
            memcpy(lo, st->lo, sizeof lo);                                                            \
            memcpy(s, st->s, sizeof s);                                                               \
            memcpy(q, st->q, sizeof q);                                                               \
            for (; i + LANES <= end; i += LANES) {                                                    \
                for (int j = 0; j < LANES; j++) {                                                     \
                    ACC a = LOAD(x, i + j);                                                           \
                    hi[j] = a > hi[j] ? a : hi[j];                                                    \
                    lo[j] = a < lo[j] ? a : lo[j];                                                    \
                    s[j] += a;                                                                        \
                    q[j] += a * a;                                                                    \
                }                                                                                     \
            }                                                                                         \
            memcpy(st->hi, hi, sizeof hi);                                                            \
            memcpy(st->lo, lo, sizeof lo);                                                            \
            memcpy(st->s, s, sizeof s);                                                               \
            memcpy(st->q, q, sizeof q);                                                               \
            st->pending += i - start;                                                                 \
            if (st->pending >= BLOCK)                                                                 \
                NAME##_flush(st);                                                                     \
        }                                                                                             \
        for (; i < n; i++) { /* the run's last values, fewer than the lanes */                        \
            ACC a = LOAD(x, i);                                                                       \
            st->top = a > st->top ? a : st->top;                                                      \
            st->bottom = a < st->bottom ? a : st->bottom;                                             \
            st->sum += a;                                                                             \
            st->squares += (double)a * a;                                                             \
        }                                                                                             \
    }                                                                                                 \
    static void NAME(const char *base, Py_ssize_t rows, Py_ssize_t run, Py_ssize_t stride,           \
                     stats_t *out) {                                                                  \
        NAME##_state st;                                                                              \
        for (int j = 0; j < LANES; j++) {                                                             \
            st.hi[j] = -INFINITY;                                                                     \
            st.lo[j] = INFINITY;                                                                      \
            st.s[j] = 0;                                                                              \
            st.q[j] = 0;                                                                              \
        }                                                                                             \
        st.top = -INFINITY;                                                                           \
        st.bottom = INFINITY;                                                                         \
        st.sum = st.squares = 0.0;                                                                    \
        st.pending = 0;                                                                               \
        for (Py_ssize_t r = 0; r < rows; r++)                                                         \
            NAME##_feed(&st, (const ELEM *)base + r * stride, run);                                   \
        NAME##_flush(&st);                                                                            \
        for (int j = 0; j < LANES; j++) {                                                             \
            st.top = st.hi[j] > st.top ? st.hi[j] : st.top;                                           \
            st.bottom = st.lo[j] < st.bottom ? st.lo[j] : st.bottom;                                  \
        }                                                                                             \
        out->max = st.top;                                                                            \
        out->min = st.bottom;                                                                         \
        out->sum = st.sum;                                                                            \
        out->squares = st.squares;                                                                    \
    }

/* The sum of squares again, each value divided by the largest magnitude first: for finite values whose
   squares overflowed a lane or underflowed (float32 gradients around 1e-20, float64 beyond 1e154 or below
   1e-154). Rare, so plain double arithmetic. */
#define SCALED(NAME, ELEM, LOAD)                                                                      \
    static double NAME(const char *base, Py_ssize_t rows, Py_ssize_t run, Py_ssize_t stride,         \
                       double scale) {                                                                \
        double squares = 0.0;                                                                         \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                       \
            const ELEM *x = (const ELEM *)base + r * stride;                                          \
            for (Py_ssize_t i = 0; i < run; i++) {                                                    \
                double a = (double)LOAD(x, i) / scale;                                                \
                squares += a * a;                                                                     \
            }                                                                                         \
        }                                                                                             \
        return squares;                                                                               \
    }

#define LOAD_PLAIN(p, k) (p)[k]
#define LOAD_BF16(p, k) bf16_to_float((p)[k])
KERNEL(stats_f32, float, float, LOAD_PLAIN)
KERNEL(stats_f64, double, double, LOAD_PLAIN)
KERNEL(stats_bf16, uint16_t, float, LOAD_BF16)
SCALED(scaled_f32, float, LOAD_PLAIN)
SCALED(scaled_f64, double, LOAD_PLAIN)
SCALED(scaled_bf16, uint16_t, LOAD_BF16)

static const char *KINDS[] = {"float32", "float64", "bfloat16"};
static const Py_ssize_t ITEM_SIZES[] = {4, 8, 2};

/* Pieces: a tensor is read as pieces of at most PIECE values (a row longer than PIECE as pieces of it; shorter
   rows as many whole rows as fit in one piece), each summed on its own, the pieces' sums then added in order.
   The grouping of the additions depends only on the tensor's layout. PIECE is a multiple of BLOCK, so a piece
   of one row moves its lane sums into double where the whole row's would. */
#define PIECE (4 * BLOCK)

typedef struct {
    const char *base;
    Py_ssize_t rows, run, stride;
    Py_ssize_t per;   /* rows per piece (rows shorter than PIECE), or 0: pieces of PIECE values of one row */
    Py_ssize_t cuts;  /* pieces per row when per is 0 */
    int kind;
} job_t;

static Py_ssize_t pieces_of(job_t *job) {
    if (job->rows <= 0 || job->run <= 0)
        return 0;
    if (job->run >= PIECE) {
        job->per = 0;
        job->cuts = (job->run + PIECE - 1) / PIECE;
        return job->rows * job->cuts;
    }
    job->per = PIECE / job->run;
    return (job->rows + job->per - 1) / job->per;
}

static void one_piece(const job_t *job, Py_ssize_t i, stats_t *out) {
    Py_ssize_t item = ITEM_SIZES[job->kind];
    const char *base;
    Py_ssize_t rows, run;
    if (job->per == 0) { /* piece i % cuts of row i / cuts */
        Py_ssize_t row = i / job->cuts, start = (i % job->cuts) * PIECE;
        base = job->base + (row * job->stride + start) * item;
        rows = 1;
        run = job->run - start < PIECE ? job->run - start : PIECE;
    } else {
        Py_ssize_t first = i * job->per;
        base = job->base + first * job->stride * item;
        rows = job->rows - first < job->per ? job->rows - first : job->per;
        run = job->run;
    }
    if (job->kind == 0)
        stats_f32(base, rows, run, job->stride, out);
    else if (job->kind == 1)
        stats_f64(base, rows, run, job->stride, out);
    else
        stats_bf16(base, rows, run, job->stride, out);
}

/* All pieces into `total`, in order. */
static void all_pieces(const job_t *job, Py_ssize_t pieces, stats_t *total) {
    total->max = -INFINITY; /* no values (only from a C caller): not finite, as the kernels leave it */
    total->min = INFINITY;
    total->sum = total->squares = 0.0;
    for (Py_ssize_t i = 0; i < pieces; i++) {
        stats_t piece;
        one_piece(job, i, &piece);
        if (i == 0) {
            *total = piece;
            continue;
        }
        total->max = piece.max > total->max ? piece.max : total->max;
        total->min = piece.min < total->min ? piece.min : total->min;
        total->sum += piece.sum;
        total->squares += piece.squares;
    }
}

/* Max, Min, Mean, Norm of `rows` runs of `run` values `stride` items apart, from `base` (kind: 0 float32,
   1 float64, 2 bfloat16). 1 when the values are all finite, 0 when not (`out` is then meaningless). Called
   with the GIL held. `flags`: STATS_MAY_RELEASE releases the GIL for large inputs, only for memory that no
   other thread can free meanwhile (a buffer export pins it). Shared with other extensions through the
   capsule `_C_API` (pytorch/_fast_encode.c reads tensors in place with it). */
static int one_pass(const char *base, Py_ssize_t rows, Py_ssize_t run, Py_ssize_t stride, int kind,
                    int flags, double out[4]) {
    stats_t r;
    Py_ssize_t bytes = rows * run * ITEM_SIZES[kind];
    job_t job = {base, rows, run, stride, 0, 0, kind};
    Py_ssize_t pieces = pieces_of(&job);
    int release = (flags & STATS_MAY_RELEASE) && bytes >= RELEASE_GIL_FROM;
    PyThreadState *state = release ? PyEval_SaveThread() : NULL;
    all_pieces(&job, pieces, &r);
    double norm = sqrt(r.squares);
    int finite = isfinite(r.sum) && isfinite(r.max) && isfinite(r.min); /* no NaN, no infinity */
    double largest = fmax(fabs(r.max), fabs(r.min));
    /* Squares that overflowed are not finite; below largest^2 they underflowed; with largest below `tiny`
       they may be subnormal in their lane (float32: 1e-38, double: 1e-308) and have lost digits. */
    double tiny = kind == 1 ? 1e-150 : 1e-17;
    if (finite && largest > 0 && (!isfinite(r.squares) || r.squares < largest * largest * (1 - 1e-6) ||
                                  largest < tiny)) {
        double scaled = kind == 0   ? scaled_f32(base, rows, run, stride, largest)
                        : kind == 1 ? scaled_f64(base, rows, run, stride, largest)
                                    : scaled_bf16(base, rows, run, stride, largest);
        norm = largest * sqrt(scaled);
    }
    if (release)
        PyEval_RestoreThread(state);
    out[0] = r.max;
    out[1] = r.min;
    out[2] = r.sum / (double)(rows * run);
    out[3] = norm;
    return finite;
}

static PyObject *stats(PyObject *self, PyObject *args) {
    Py_buffer view;
    const char *kind_name;
    Py_ssize_t run = 0, stride = 0;
    if (!PyArg_ParseTuple(args, "y*s|nn:stats", &view, &kind_name, &run, &stride))
        return NULL;
    int kind = -1;
    for (int k = 0; k < 3; k++)
        if (strcmp(kind_name, KINDS[k]) == 0)
            kind = k;
    Py_ssize_t items = kind >= 0 ? view.len / ITEM_SIZES[kind] : 0;
    if (kind < 0 || view.len == 0 || view.len % ITEM_SIZES[kind] != 0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError,
                     "stats(): expected a non-empty contiguous buffer of float32, float64 or bfloat16 "
                     "(2-byte) items and its kind, got %zd bytes of kind '%s'",
                     view.len, kind_name);
        return NULL;
    }
    Py_ssize_t rows = 1;
    if (run == 0 && stride == 0) {
        run = stride = items;
    } else if (run <= 0 || run > items || stride < run || (items - run) % stride != 0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError,
                     "stats(): rows of %zd values every %zd values do not end where a buffer of %zd values "
                     "ends (expected 0 < run <= stride and (items - run) a multiple of stride)",
                     run, stride, items);
        return NULL;
    } else {
        rows = (items - run) / stride + 1;
    }
    double out[4];
    int finite = one_pass((const char *)view.buf, rows, run, stride, kind, STATS_MAY_RELEASE,
                          out); /* the view pins it */
    PyBuffer_Release(&view);
    if (!finite)
        Py_RETURN_NONE; /* NaN, an infinity, or a float32 lane sum overflowed: the exact route decides */
    return Py_BuildValue("(dddd)", out[0], out[1], out[2], out[3]);
}

/* Stats: a summary's (Max, Min, Mean, Norm) as one object holding four doubles, read like the tuple it
   stands for (indexing, slicing, unpacking, iteration, len, ==, hash, repr; pickled as that tuple).

Why: a training step keeps every summary it made alive until its dump is written, and at small sizes it
makes several hundred a step. As a tuple of four floats the numbers are five objects; as a Stats they are
one, with no references for the garbage collector to follow: fewer allocations, fewer live bytes. Only statistics that are four finite floats take this form; the rest stay tuples. */
static PyTypeObject StatsType;

static PyObject *new_stats(const double values[4]) {
    StatsObject *self = PyObject_New(StatsObject, &StatsType);
    if (self != NULL)
        memcpy(self->values, values, sizeof self->values);
    return (PyObject *)self;
}

static PyObject *stats_as_tuple(PyObject *self) {
    const double *v = ((StatsObject *)self)->values;
    return Py_BuildValue("(dddd)", v[0], v[1], v[2], v[3]);
}

static PyObject *Stats_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *items;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Stats() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O:Stats", &items))
        return NULL;
    double values[4];
    PyObject *seq = PySequence_Fast(items, "Stats() expects a sequence of 4 floats (Max, Min, Mean, Norm)");
    if (seq == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != 4) {
        PyErr_Format(PyExc_ValueError, "Stats() expects 4 values (Max, Min, Mean, Norm), got %zd",
                     PySequence_Fast_GET_SIZE(seq));
        Py_DECREF(seq);
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        values[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (values[i] == -1.0 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    (void)type;
    return new_stats(values);
}

static Py_ssize_t Stats_len(PyObject *self) {
    (void)self;
    return 4;
}

static PyObject *Stats_item(PyObject *self, Py_ssize_t i) {
    if (i < 0 || i >= 4) {
        PyErr_SetString(PyExc_IndexError, "Stats index out of range");
        return NULL;
    }
    return PyFloat_FromDouble(((StatsObject *)self)->values[i]);
}

static PyObject *Stats_subscript(PyObject *self, PyObject *key) {
    if (PyIndex_Check(key)) {
        Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred())
            return NULL;
        return Stats_item(self, i < 0 ? i + 4 : i);
    }
    PyObject *tuple = stats_as_tuple(self); /* slices: the tuple's own rules */
    PyObject *out = tuple ? PyObject_GetItem(tuple, key) : NULL;
    Py_XDECREF(tuple);
    return out;
}

/* Equal to the tuple it stands for (and to a Stats of the same numbers); other comparisons as tuples. */
static PyObject *Stats_richcompare(PyObject *self, PyObject *other, int op) {
    if (!PyTuple_Check(other) && Py_TYPE(other) != &StatsType)
        Py_RETURN_NOTIMPLEMENTED;
    if (self == other && (op == Py_EQ || op == Py_NE)) /* as a tuple is: equal to itself, NaN or not */
        return PyBool_FromLong(op == Py_EQ);
    PyObject *mine = stats_as_tuple(self);
    PyObject *theirs = Py_TYPE(other) == &StatsType ? stats_as_tuple(other) : (Py_INCREF(other), other);
    PyObject *out = mine && theirs ? PyObject_RichCompare(mine, theirs, op) : NULL;
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    return out;
}

static Py_hash_t Stats_hash(PyObject *self) {
    PyObject *tuple = stats_as_tuple(self);
    Py_hash_t hash = tuple ? PyObject_Hash(tuple) : -1;
    Py_XDECREF(tuple);
    return hash;
}

static PyObject *Stats_repr(PyObject *self) {
    PyObject *tuple = stats_as_tuple(self);
    PyObject *text = tuple ? PyObject_Repr(tuple) : NULL;
    Py_XDECREF(tuple);
    return text;
}

static PyObject *Stats_reduce(PyObject *self, PyObject *unused) {
    (void)unused;
    PyObject *tuple = stats_as_tuple(self);
    return tuple ? Py_BuildValue("O(N)", (PyObject *)&PyTuple_Type, tuple) : NULL;
}

static PySequenceMethods Stats_as_sequence = {.sq_length = Stats_len, .sq_item = Stats_item};
static PyMappingMethods Stats_as_mapping = {.mp_length = Stats_len, .mp_subscript = Stats_subscript};
static PyMethodDef Stats_methods[] = {
    {"__reduce__", Stats_reduce, METH_NOARGS, "pickled (and copied) as the tuple it stands for"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject StatsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "msprobe_lite.core._fast_stats.Stats",
    .tp_basicsize = sizeof(StatsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Stats(values): a summary's (Max, Min, Mean, Norm) as four doubles in one object, read like "
              "the tuple it stands for.",
    .tp_new = Stats_new,
    .tp_repr = Stats_repr,
    .tp_hash = Stats_hash,
    .tp_richcompare = Stats_richcompare,
    .tp_as_sequence = &Stats_as_sequence,
    .tp_as_mapping = &Stats_as_mapping,
    .tp_methods = Stats_methods,
};

static PyMethodDef METHODS[] = {
    {"stats", stats, METH_VARARGS,
     "stats(buffer, kind, run=0, stride=0) -> (Max, Min, Mean, Norm), or None when the values are "
     "not all finite.\n\nkind: 'float32', 'float64' or 'bfloat16' (a buffer of the 2-byte bfloat16 items). "
     "With run and stride, the values are rows of `run` items starting every `stride` items (a slice of a "
     "wider tensor); the items between rows are not read."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fast_stats",
                                    "One-pass tensor statistics (see core/statistics.py).", -1, METHODS};

/* The C-level entry point for other extensions: a capsule holding the addresses of one_pass() and
   new_stats(), and the Stats type. */
static FastStatsApi API = {one_pass, new_stats, &StatsType};

PyMODINIT_FUNC PyInit__fast_stats(void) {
    PyObject *module = module_with_type(&MODULE, "Stats", &StatsType);
    PyObject *capsule = module ? PyCapsule_New(&API, FAST_STATS_CAPSULE, NULL) : NULL;
    if (capsule == NULL || PyModule_AddObject(module, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_XDECREF(module);
        return NULL;
    }
    return module;
}
