/* Call arguments and results to their dump values, with PyTorch tensor summaries, in C.

Why C: every captured call encodes its arguments and its result, and a step of a small model has a few
hundred calls with about a thousand tensors among them. In Python (core/values.py walking, core/summary.py
caching, pytorch/summary.py summarising) a tensor is mostly interpreter work around a kernel that takes a
fraction of a microsecond on small tensors.

What is done here, with the same results as the Python route (tests compare the two):
- the walk of ValueEncoder._walk for tensors, None, bool/int/float/str, tuples, lists and dicts; any other
  value (namedtuples, slices, framework objects, tensor subclasses) is handed to the Python walk;
- the summary cache of Summarizer._cached: entries (weak reference, _version, summary) keyed by id;
- summaries of CPU float32/float64/bfloat16 tensors that are not lazily negated and not empty, and whose
  values are contiguous or rows of memory (a transposed tensor, q/k/v sliced out of one projection: the
  layouts of summary.py `_rows`), read in place by the one-pass kernel of core/_fast_stats.c; int64 and
  bool tensors of the same layouts are read here, and float values with infinities but no NaN (masked
  attention scores). Every other tensor, float values with NaN, and int64 or float values whose sums could
  come out differently in another order, are summarised by the Python route (`summarize`);
- with summary_mode md5, the md5 field (CRC-32 of the raw bytes) of those tensors when they are row-major
  contiguous and up to 64 KiB, by zlib_ng.crc32 over a copy; other tensors go to the Python route.
Used only while no tensor file is written for the record (the file names need each value's path).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#include "_fast_stats.h"
#include "_slots.h"
#include "_module.h"
#include "_quiet.h"
#include "_weakref.h"

static FastStatsApi *STATS;
static PyObject *S_type, *S_value, *S_torch_tensor, *S_requires_grad, *S_nbytes;

/* The tensor's attributes and methods read here, in the order of READ_NAMES. */
enum { R_VERSION, R_DTYPE, R_IS_CPU, R_LAYOUT, R_SHAPE, R_REQUIRES_GRAD, R_IS_NEG, R_STRIDE, R_DATA_PTR,
       R_STORAGE, R_STORAGE_OFFSET, N_READS };
static const char *const READ_NAMES[N_READS] = {"_version", "dtype", "is_cpu", "layout", "shape", "requires_grad",
                                                "is_neg", "stride", "data_ptr", "untyped_storage", "storage_offset"};
static PyObject *READ_STRS[N_READS];
static PyObject *TYPE_NAMES[4]; /* "bool", "int", "float", "str" */

/* Takes an object that can never be part of a reference cycle out of the garbage collector's lists.

Why: a step's summaries, their statistics and their cache entries live until the step is written, so the
young collections that run meanwhile promote them to the oldest generation, and every such object brings a
full collection nearer (CPython runs one when a quarter as many objects as that generation holds have been
promoted since the last), and a full collection of a process that imported torch is slow. Untracked objects are still freed by
reference counting, as usual. Only for objects whose references are atoms (str, int, float, bool, tuples of
them) or weak references without a callback: such an object cannot be on a cycle, which is all the collector
looks for. */
static void untrack(PyObject *v) {
    if (PyObject_IS_GC(v) && PyObject_GC_IsTracked(v))
        PyObject_GC_UnTrack(v);
}

typedef struct {
    PyObject_HEAD
    PyObject *tensor_types; /* tuple: the exact types summarised here (torch.Tensor, nn.Parameter) */
    PyObject *walk;         /* walk(value, depth) -> encoded: the Python route, for everything else */
    PyObject *cache;        /* dict id -> (weakref, version, summary): the summarizer's own (cleared in place) */
    PyObject *summarize;    /* summarize(t) -> summary: the Python route for a cache miss */
    PyObject *summary_type; /* TensorSummary */
    PyObject *kinds;        /* dict dtype -> (kernel kind, dtype name) for the dtypes read here */
    PyObject *strided;      /* torch.strided */
    PyObject *shape_of;     /* records.canonical_shape */
    PyObject *shapes;       /* records.SHAPES: the shapes it has made canonical */
    slots_t summary_slots;  /* TensorSummary made without its __init__ (see _slots.h), when it can be */
    slots_t record_slots;   /* the slots of the last record sealed (core/records.py Record) */
    int max_depth;          /* values.MAX_DEPTH: deeper values go to the Python walk, which ends them */
    PyObject *crc;          /* summary_mode md5: zlib_ng.crc32, the md5 field's CRC-32 (else None) */
    PyObject *quiet;        /* torch._C.DisableTorchFunction, for bare(); None without it */
    int lazy;               /* in bare(): torch-function dispatch is turned off around Python code only */
    PyObject *reads[N_READS]; /* the descriptors of READ_NAMES that every type of tensor_types shares, or NULL */
    PyObject *storage_type;   /* the class of the last untyped storage read, and its data_ptr, nbytes */
    PyObject *storage_reads[2];
    PyObject *tainted;      /* list of (start, end): Summarizer._tainted, storages written past the version */
} Encoder;

/* `fn(arg)`, or `fn(arg, level)`; in bare() with torch-function dispatch turned off around it: the Python
   routes read and compute on tensors the C side leaves to them (subclasses among them), and none of that is
   the user's (a tensor subclass's __torch_function__ must not see it). */
static PyObject *call_python(Encoder *e, PyObject *fn, PyObject *arg, PyObject *level) {
    PyObject *quiet = e->lazy ? quiet_enter(e->quiet) : NULL;
    if (e->lazy && quiet == NULL)
        return NULL;
    PyObject *out = level ? PyObject_CallFunctionObjArgs(fn, arg, level, NULL) : PyObject_CallOneArg(fn, arg);
    if (quiet != NULL && quiet_exit(quiet) < 0)
        Py_CLEAR(out);
    return out;
}

static int is_fast_tensor(Encoder *e, PyObject *v) {
    PyObject *kind = (PyObject *)Py_TYPE(v);
    Py_ssize_t n = PyTuple_GET_SIZE(e->tensor_types);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyTuple_GET_ITEM(e->tensor_types, i) == kind)
            return 1;
    return 0;
}

/* What the tensor `t` (of one of tensor_types) reads for READ_NAMES[which]: the attribute, or the result of
   the method, as torch.Tensor defines it. A method set on one tensor object (`t.stride = ...`) must not
   redirect the kernel's read of the memory that shape, stride() and data_ptr() describe.

   Why the descriptors are kept (Encoder.__init__ finds them in the class): a new summary reads nine of these,
   and each `PyObject_GetAttr` first looks the name up in the class (a method also in the metaclass) before
   PyTorch's getter runs; here the getter is called at once, the method through its descriptor. The tensor
   types are exact types (is_fast_tensor), so the descriptor found in the class is the one the lookup would
   find; when a type of tensor_types has another one (a subclass overriding it), the lookup is made. A patch
   of torch.Tensor's class attributes made after the encoder is (`torch.Tensor.shape = ...`) is therefore not
   followed here, where the Python route would follow it: the kernel reads memory, and PyTorch's own getters
   are what describe it. */
static PyObject *read_of(Encoder *e, PyObject *t, int which) {
    PyObject *descr = e->reads[which];
    if (descr == NULL)
        return which < R_IS_NEG ? PyObject_GetAttr(t, READ_STRS[which])
                                : PyObject_CallMethodNoArgs(t, READ_STRS[which]);
    if (Py_IS_TYPE(descr, &PyGetSetDescr_Type))
        return PyGetSetDescr_Type.tp_descr_get(descr, t, (PyObject *)Py_TYPE(t));
    return PyObject_Vectorcall(descr, &t, 1, NULL); /* a method descriptor checks the type of `t` itself */
}

/* A bool read: 1, 0, or -1 with an exception set. */
static int read_bool(Encoder *e, PyObject *t, int which) {
    PyObject *v = read_of(e, t, which);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* What the attribute lookup of `name` on an instance of `kind` finds in the class: the first entry along the
   MRO's class dicts, no descriptor called, as inspect.getattr_static finds it (a new reference, or NULL with
   no exception when none; NULL with an exception on an error). Only Encoder.__init__ looks, once. */
static PyObject *class_attribute(PyTypeObject *kind, PyObject *name) {
    PyObject *mro = kind->tp_mro;
    if (mro == NULL || !PyTuple_Check(mro))
        return NULL;
    Py_INCREF(mro); /* the MRO may be replaced while a dict is read */
    PyObject *found = NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro) && found == NULL; i++) {
        PyObject *base = PyTuple_GET_ITEM(mro, i);
        if (!PyType_Check(base))
            continue;
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *dict = PyType_GetDict((PyTypeObject *)base);
#else
        PyObject *dict = Py_XNewRef(((PyTypeObject *)base)->tp_dict);
#endif
        if (dict == NULL)
            continue;
        found = Py_XNewRef(PyDict_GetItemWithError(dict, name));
        Py_DECREF(dict);
        if (found == NULL && PyErr_Occurred())
            break;
    }
    Py_DECREF(mro);
    return found;
}

/* Encoder.__init__: the descriptor of each read that the tensor types share, when it is PyTorch's getter or
   method (see read_of); NULL otherwise. */
static void find_reads(PyObject *tensor_types, PyObject **reads) {
    for (int i = 0; i < N_READS; i++) {
        PyObject *found = NULL;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(tensor_types); k++) {
            PyObject *kind = PyTuple_GET_ITEM(tensor_types, k);
            PyObject *descr = PyType_Check(kind) ? class_attribute((PyTypeObject *)kind, READ_STRS[i]) : NULL;
            if (descr == NULL)
                PyErr_Clear(); /* an odd class: its reads are looked up per tensor */
            int usable = descr != NULL && (Py_IS_TYPE(descr, i < R_IS_NEG ? &PyGetSetDescr_Type : &PyMethodDescr_Type));
            if (!usable || (found != NULL && descr != found)) {
                Py_XDECREF(descr);
                Py_CLEAR(found);
                break;
            }
            Py_XSETREF(found, descr);
        }
        Py_XSETREF(reads[i], found);
    }
}

static PyObject *summary_of(Encoder *e, PyObject *t, PyObject *kind, PyObject *version);

/* storage.data_ptr() (which 0) or storage.nbytes() (1) of a tensor's untyped storage: through the method
   descriptors of its class, found once per class as find_reads finds the tensor's. */
static PyObject *storage_read(Encoder *e, PyObject *storage, int which) {
    PyObject *names[2] = {READ_STRS[R_DATA_PTR], S_nbytes};
    if ((PyObject *)Py_TYPE(storage) != e->storage_type) {
        for (int i = 0; i < 2; i++) {
            PyObject *descr = class_attribute(Py_TYPE(storage), names[i]);
            if (descr == NULL && PyErr_Occurred())
                return NULL;
            if (descr != NULL && !Py_IS_TYPE(descr, &PyMethodDescr_Type))
                Py_CLEAR(descr);
            Py_XSETREF(e->storage_reads[i], descr);
        }
        Py_INCREF(Py_TYPE(storage));
        Py_XSETREF(e->storage_type, (PyObject *)Py_TYPE(storage));
    }
    PyObject *descr = e->storage_reads[which];
    return descr ? PyObject_Vectorcall(descr, &storage, 1, NULL) : PyObject_CallMethodNoArgs(storage, names[which]);
}

/* Py_None: the tensor is for the Python route, which summarises an odd tensor or reports why it cannot (an
   attribute that raised an Exception here is forgotten); NULL for KeyboardInterrupt and the like. */
static PyObject *for_python(void) {
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
    }
    Py_RETURN_NONE;
}

/* TorchSummarizer._summarize for the tensors read in place, or Py_None (new reference) when this one is
   for the Python route. NULL only on an error that is not the tensor's (memory). */
static PyObject *summary_in_c(Encoder *e, PyObject *t, PyObject *version) {
    PyObject *dtype = read_of(e, t, R_DTYPE);
    if (dtype == NULL)
        goto python;
    PyObject *kind = PyDict_GetItemWithError(e->kinds, dtype); /* (kind, name): held below, the kernel may */
    Py_DECREF(dtype);                                            /* release the GIL */
    if (kind == NULL)
        goto python;
    Py_INCREF(kind);
    PyObject *summary = summary_of(e, t, kind, version);
    Py_DECREF(kind);
    return summary;
python:
    return for_python();
}

#define MAX_DIMS 64

/* The layout rule of pytorch/summary.py `_rows`: 1 and (rows, run, stride) when the values of `shape` and
   `strides` are `rows` runs of `run` contiguous items, `stride` items apart, in some order of the dimensions
   (a permuted tensor: one run; q, k and v sliced out of one projection: rows); 0 for other layouts. */
static int rows_of(PyObject *shape, PyObject *strides, Py_ssize_t *rows, Py_ssize_t *run, Py_ssize_t *stride) {
    Py_ssize_t ndim = PyTuple_GET_SIZE(strides), dims[MAX_DIMS][2], n = 0; /* (stride, size), size != 1 */
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != ndim || ndim > MAX_DIMS)
        return 0;
    for (Py_ssize_t i = 0; i < ndim; i++) {
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        Py_ssize_t step = PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, i));
        if ((size == -1 || step == -1) && PyErr_Occurred())
            return 0;
        if (size == 1)
            continue;
        Py_ssize_t j = n++; /* insertion by (stride, size), as `sorted` orders the pairs */
        while (j > 0 && (dims[j - 1][0] > step || (dims[j - 1][0] == step && dims[j - 1][1] > size))) {
            dims[j][0] = dims[j - 1][0];
            dims[j][1] = dims[j - 1][1];
            j--;
        }
        dims[j][0] = step;
        dims[j][1] = size;
    }
    Py_ssize_t groups = 0; /* merged in place: a dimension that continues the previous group joins it */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (groups && dims[i][0] == dims[groups - 1][0] * dims[groups - 1][1]) {
            dims[groups - 1][1] *= dims[i][1];
        } else {
            if (groups == 2)
                return 0;
            dims[groups][0] = dims[i][0];
            dims[groups][1] = dims[i][1];
            groups++;
        }
    }
    if (groups == 0 || dims[0][0] != 1)
        return 0;
    *run = dims[0][1];
    *rows = groups == 1 ? 1 : dims[1][1];
    *stride = groups == 1 ? *run : dims[1][0];
    return *stride >= *run;
}

/* Kinds read here besides the kernel's floats (0 float32, 1 float64, 2 bfloat16): token ids, positions and
   targets (int64) and masks (bool), a few in every step of a transformer. The Python route reads them
   through numpy, whose rarely run code is slow in the middle of a training step. */
#define KIND_INT64 3
#define KIND_BOOL 4
#define EXACT_BELOW 4503599627370496.0 /* 2^52: sums kept below it are exact in float64 (2^53), with room */

/* (Max, Min, Mean, Norm) of int64 values as the Python route gives them (summary.py `_cpu_stats`: exact Max
   and Min, Mean and Norm from float64 sums), or NULL with no exception set when that route must decide:
   its float64 sums are exact, whatever their order, only while every partial sum stays small (EXACT_BELOW).
   One pass: the sums are unsigned, so they wrap (defined) rather than overflow, and are used only when the
   largest magnitude says that they could not have. */
static PyObject *int64_stats(const char *base, Py_ssize_t rows, Py_ssize_t run, Py_ssize_t stride) {
    int64_t high = INT64_MIN, low = INT64_MAX;
    uint64_t sum = 0, squares = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int64_t *x = (const int64_t *)base + r * stride;
        for (Py_ssize_t k = 0; k < run; k++) {
            high = x[k] > high ? x[k] : high;
            low = x[k] < low ? x[k] : low;
            sum += (uint64_t)x[k];
            squares += (uint64_t)x[k] * (uint64_t)x[k];
        }
    }
    uint64_t up = high > 0 ? (uint64_t)high : 0, down = low < 0 ? (uint64_t)0 - (uint64_t)low : 0;
    double largest = (double)(up > down ? up : down), n = (double)(rows * run); /* the largest magnitude */
    if (largest * n >= EXACT_BELOW || largest * largest * n >= EXACT_BELOW)
        return NULL;
    int64_t total = (int64_t)sum; /* exact: its magnitude is below 2^52 by the test above */
    return Py_BuildValue("(LLdd)", (long long)high, (long long)low, (double)total / n, sqrt((double)squares));
}

/* (Max, Min, Mean, Norm) of bool values as the Python route gives them: (any, all, None, None). */
static PyObject *bool_stats(const char *base, Py_ssize_t rows, Py_ssize_t run, Py_ssize_t stride) {
    int any = 0, all = 1;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const unsigned char *x = (const unsigned char *)base + r * stride;
        for (Py_ssize_t k = 0; k < run; k++) {
            any |= x[k] != 0;
            all &= x[k] != 0;
        }
    }
    return Py_BuildValue("(OOOO)", any ? Py_True : Py_False, all ? Py_True : Py_False, Py_None, Py_None);
}

/* Whether float values hold +inf (`above`) and -inf (`below`), and their largest finite magnitude; 0 when
   one is NaN. One loop per kind (float32, float64, bfloat16 as float32), rows of `run` values `stride` apart,
   8 independent lanes without branches (one lane would wait on each comparison). */
#define INFINITIES(NAME, ELEM, LOAD)                                                                     \
    static int NAME(const char *base, Py_ssize_t rows, Py_ssize_t run, Py_ssize_t stride, int *above,    \
                    int *below, double *largest) {                                                       \
        int up = 0, down = 0, nan = 0;                                                                   \
        double m[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                          \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                          \
            const ELEM *x = (const ELEM *)base + r * stride;                                             \
            Py_ssize_t k = 0;                                                                            \
            for (; k + 8 <= run; k += 8)                                                                 \
                for (int j = 0; j < 8; j++) {                                                            \
                    double v = LOAD(x[k + j]), size = fabs(v);                                           \
                    nan |= v != v;                                                                       \
                    up |= v == INFINITY;                                                                 \
                    down |= v == -INFINITY;                                                              \
                    m[j] = size < INFINITY && size > m[j] ? size : m[j];                                 \
                }                                                                                        \
            for (; k < run; k++) {                                                                       \
                double v = LOAD(x[k]), size = fabs(v);                                                   \
                nan |= v != v;                                                                           \
                up |= v == INFINITY;                                                                     \
                down |= v == -INFINITY;                                                                  \
                m[0] = size < INFINITY && size > m[0] ? size : m[0];                                     \
            }                                                                                            \
        }                                                                                                \
        for (int j = 1; j < 8; j++)                                                                      \
            m[0] = m[j] > m[0] ? m[j] : m[0];                                                            \
        *above = up;                                                                                     \
        *below = down;                                                                                   \
        *largest = m[0];                                                                                 \
        return !nan;                                                                                     \
    }

static inline double plain(double v) { return v; }

INFINITIES(infinities_f32, float, plain)
INFINITIES(infinities_f64, double, plain)
INFINITIES(infinities_bf16, uint16_t, bf16_to_float)

/* (Max, Min, Mean, Norm) as a tuple of floats. */
static PyObject *stats_tuple(const double *out) {
    PyObject *stats = PyTuple_New(4);
    for (int i = 0; stats != NULL && i < 4; i++) {
        PyObject *v = PyFloat_FromDouble(out[i]);
        if (v == NULL)
            Py_CLEAR(stats);
        else
            PyTuple_SET_ITEM(stats, i, v);
    }
    return stats;
}

/* (Max, Min, Mean, Norm) of float values the kernel found not all finite (`out`: its Max and Min, which
   ignore NaN), when they hold infinities and no NaN (masked attention scores: -inf), as the Python route
   gives them: Max and Min what they are, Norm infinite, Mean the infinity's sign (NaN with both signs).
   That route sums in float32 (float64 for float64 values), so its Mean is that only while the finite
   values cannot overflow a sum in any order: their largest magnitude times their number stays below a
   quarter of the type's largest value. Only up to INFINITE_IN_C values: above, that route's vectorised
   reductions are faster than this loop.
   NULL (no exception set) when the Python route decides: NaN, a float32 sum that overflowed without any
   infinity, a zero Max or Min (its sign), more values. */
#define INFINITE_IN_C (1 << 14)
static PyObject *infinite_stats(const char *base, int kind, Py_ssize_t rows, Py_ssize_t run, Py_ssize_t stride,
                                const double out[4]) {
    if (rows * run > INFINITE_IN_C)
        return NULL;
    int above = 0, below = 0, clean;
    double largest = 0;
    if (kind == 0)
        clean = infinities_f32(base, rows, run, stride, &above, &below, &largest);
    else if (kind == 1)
        clean = infinities_f64(base, rows, run, stride, &above, &below, &largest);
    else
        clean = infinities_bf16(base, rows, run, stride, &above, &below, &largest);
    if (!clean || !(above || below) || !(largest * (double)(rows * run) < (kind == 1 ? DBL_MAX : FLT_MAX) / 4))
        return NULL;
    if (out[0] == 0 || out[1] == 0) /* +0.0 or -0.0: which one numpy's max/min keep depends on its order */
        return NULL;
    double mean = above && below ? NAN : above ? INFINITY : -INFINITY;
    double stats[4] = {out[0], out[1], mean, INFINITY};
    return stats_tuple(stats);
}

/* records.canonical_shape(shape): the dict's shared tuple when the shape was seen before (the common case,
   no Python call), else the function's. */
static PyObject *canonical_shape(Encoder *e, PyObject *shape) {
    PyObject *plain = PyDict_GetItemWithError(e->shapes, shape);
    if (plain != NULL) {
        Py_INCREF(plain);
        return plain;
    }
    return PyErr_Occurred() ? NULL : PyObject_CallOneArg(e->shape_of, shape);
}

/* The memory of a tensor with `shape` and `strides` as (rows, run, stride) for the kernel (see rows_of), and
   its number of values in *n; 0 when the values are not rows of memory, or there are none. `shape` and
   `strides` are the tensor's own: numel() and is_contiguous() follow from them without two more calls. */
static int layout_of(PyObject *shape, PyObject *strides, Py_ssize_t *n, Py_ssize_t *rows, Py_ssize_t *run,
                     Py_ssize_t *stride) {
    if (!PyTuple_Check(shape) || !PyTuple_Check(strides))
        return 0;
    Py_ssize_t count = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        if (size < 0 || (size > 0 && count > PY_SSIZE_T_MAX / size)) {
            PyErr_Clear();
            return 0;
        }
        count *= size;
    }
    *n = count;
    if (count == 0)
        return 0;
    if (count == 1) { /* a scalar, or every dimension of size 1 */
        *rows = *run = *stride = 1;
        return 1;
    }
    return rows_of(shape, strides, rows, run, stride);
}

static const char *const SUMMARY_SLOTS[] = {"type", "dtype", "shape", "stats", "requires_grad", "md5"};
static const char *const RECORD_SLOTS[] = {"name", "data"};

/* Bytes per value of the kinds read here: the kernel's float32, float64, bfloat16, then int64 and bool. */
static const Py_ssize_t ITEM_SIZES[KIND_BOOL + 1] = {4, 8, 2, 8, 1};

/* 1 when `strides` are those of a row-major contiguous tensor of `shape` (a size-1 dimension's stride is
   any): its bytes in memory are the bytes of its values in order, what the md5 field's CRC is taken of. */
static int c_contiguous(PyObject *shape, PyObject *strides) {
    if (!PyTuple_Check(shape) || !PyTuple_Check(strides) || PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(strides))
        return 0;
    Py_ssize_t expected = 1;
    for (Py_ssize_t i = PyTuple_GET_SIZE(shape) - 1; i >= 0; i--) {
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        Py_ssize_t step = PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, i));
        if ((size == -1 || step == -1) && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (size != 1 && step != expected)
            return 0;
        expected *= size;
    }
    return 1;
}

/* Up to this many bytes, the md5 field's CRC is taken here; a larger tensor goes to the Python route, whose
   numpy view keeps its memory from being freed or resized while zlib-ng, which lets go of the GIL on large
   buffers, reads it (there a copy would cost more than that route's few microseconds). */
#define CRC_IN_C_MAX (64 * 1024)

/* The md5 field of summary_mode md5 (pytorch/summary.py crc32_hex: CRC-32 of the raw bytes, 8 hex digits) of
   the `nbytes` bytes at `data`, by zlib_ng.crc32 over a copy made with the GIL held: the tensor's memory is
   read only while no other thread can run (holding its storage would not keep `resize_()` from freeing it),
   and zlib-ng may then let go of the GIL over the copy. NULL (no exception set) when the Python route is to
   decide. */
static PyObject *crc_text(Encoder *e, const char *data, Py_ssize_t nbytes) {
    PyObject *copy = PyBytes_FromStringAndSize(data, nbytes);
    PyObject *crc = copy ? PyObject_CallOneArg(e->crc, copy) : NULL;
    Py_XDECREF(copy);
    unsigned long value = crc ? PyLong_AsUnsignedLong(crc) : 0;
    Py_XDECREF(crc);
    char hex[17];
    PyObject *text = NULL;
    if (crc != NULL && !PyErr_Occurred() && snprintf(hex, sizeof hex, "%08lx", value) == 8)
        text = PyUnicode_FromStringAndSize(hex, 8);
    if (text == NULL && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear();
    return text;
}

/* summary_in_c once the dtype is one read here. Reads of the tensor: is_cpu (a CPU tensor is not a meta
   one), is_neg(), layout, shape, stride(), data_ptr(), requires_grad. */
/* `version`: t._version read before (NULL for an inference tensor). */
static PyObject *summary_of(Encoder *e, PyObject *t, PyObject *kind, PyObject *version) {
    if (read_bool(e, t, R_IS_CPU) != 1 || read_bool(e, t, R_IS_NEG) != 0)
        goto python;
    PyObject *layout = read_of(e, t, R_LAYOUT);
    if (layout == NULL)
        goto python;
    Py_DECREF(layout); /* torch.strided lives as long as torch: comparing the pointer is enough */
    if (layout != e->strided)
        goto python;
    Py_ssize_t n = 0, rows = 1, run = 1, stride = 1;
    PyObject *shape = read_of(e, t, R_SHAPE);
    PyObject *strides = shape ? read_of(e, t, R_STRIDE) : NULL;
    int fits = strides && layout_of(shape, strides, &n, &rows, &run, &stride) && rows * run == n;
    long code = PyLong_AsLong(PyTuple_GET_ITEM(kind, 0));
    int md5_mode = e->crc != NULL && e->crc != Py_None;
    if (fits && md5_mode) /* md5: the bytes in memory are the values in order, and few enough to copy */
        fits = c_contiguous(shape, strides) && n <= CRC_IN_C_MAX / ITEM_SIZES[code];
    Py_XDECREF(strides);
    /* The storage is held while its memory is read: another thread's `t.set_()` or `t.data =` would free
       the tensor's old storage otherwise. The values read must lie inside it (the shape was read before). */
    PyObject *storage = fits ? read_of(e, t, R_STORAGE) : NULL;
    PyObject *offset = storage ? read_of(e, t, R_STORAGE_OFFSET) : NULL;
    PyObject *base = offset ? storage_read(e, storage, 0) : NULL;
    PyObject *size = base ? storage_read(e, storage, 1) : NULL;
    const char *data = NULL;
    if (size != NULL) {
        Py_ssize_t first = PyLong_AsSsize_t(offset), bytes = PyLong_AsSsize_t(size), item = ITEM_SIZES[code];
        char *start = (char *)PyLong_AsVoidPtr(base);
        Py_ssize_t extent = (rows - 1) * stride + run; /* values from the first one read to the last */
        if (!PyErr_Occurred() && start != NULL && first >= 0 && first <= bytes / item &&
            extent <= bytes / item - first)
            data = start + first * item;
    }
    Py_XDECREF(offset);
    Py_XDECREF(base);
    Py_XDECREF(size);
    if (data == NULL) {
        Py_XDECREF(storage);
        Py_XDECREF(shape);
        goto python;
    }
    PyObject *stats;
    if (code == KIND_INT64 || code == KIND_BOOL) {
        stats = code == KIND_INT64 ? int64_stats((const char *)data, rows, run, stride)
                                   : bool_stats((const char *)data, rows, run, stride);
    } else {
        double out[4];
        if (STATS->one_pass((const char *)data, rows, run, stride, (int)code, 0, out))
            stats = STATS->new_stats(out); /* one object, not five (see Stats in core/_fast_stats.c) */
        else /* NaN, or a float32 lane sum that overflowed: the library route's rules */
            stats = infinite_stats((const char *)data, (int)code, rows, run, stride, out);
    }
    PyObject *md5 = Py_None;
    Py_INCREF(md5);
    if (stats != NULL && md5_mode) {
        Py_SETREF(md5, crc_text(e, (const char *)data, n * ITEM_SIZES[code]));
        if (md5 == NULL)
            Py_CLEAR(stats);
    }
    Py_DECREF(storage);
    if (stats != NULL && version != NULL) {
        /* Another thread inside torch (the GIL released there) may have changed this tensor meanwhile, as
           `t.set_()` or `resize_()`: both change its version, and such statistics go to the Python route. A
           `resize_()` of the held storage itself frees its old memory under the reader; no public interface
           pins it. A program that changes a tensor on one thread while torch reads it on another is racy with
           or without the debugger. */
        PyObject *now = read_of(e, t, R_VERSION);
        int same = now ? PyObject_RichCompareBool(now, version, Py_EQ) : -1;
        Py_XDECREF(now);
        if (same != 1) {
            Py_CLEAR(stats);
            PyErr_Clear();
        }
    }
    if (stats == NULL) {
        Py_XDECREF(md5);
        Py_DECREF(shape);
        if (PyErr_Occurred())
            return NULL;
        goto python; /* int64 sums that float64 may round, NaN: the Python route's order decides */
    }
    PyObject *plain = canonical_shape(e, shape);
    Py_DECREF(shape);
    int grad = plain ? read_bool(e, t, R_REQUIRES_GRAD) : -1;
    if (grad < 0) {
        Py_XDECREF(plain);
        Py_DECREF(stats);
        Py_DECREF(md5);
        goto python;
    }
    PyObject *fields[] = {S_torch_tensor, PyTuple_GET_ITEM(kind, 1), plain, stats, grad ? Py_True : Py_False,
                          md5};
    PyObject *summary = e->summary_slots.type != NULL
                            ? slots_new(&e->summary_slots, fields)
                            : PyObject_CallFunctionObjArgs(e->summary_type, fields[0], fields[1], fields[2],
                                                           fields[3], fields[4], fields[5], NULL);
    Py_DECREF(plain);
    Py_DECREF(stats);
    Py_DECREF(md5);
    return summary;
python:
    return for_python();
}

static int sealed(Encoder *e, PyObject *v, int depth, Py_ssize_t *visits);

/* A new summary of `t` (in C, or by the Python route), out of the collector's lists when it can be. */
static PyObject *fresh_summary(Encoder *e, PyObject *t, PyObject *version) {
    PyObject *summary = summary_in_c(e, t, version);
    if (summary == Py_None) {
        Py_DECREF(summary);
        summary = call_python(e, e->summarize, t, NULL);
    }
    Py_ssize_t visits = 0;
    if (summary != NULL)
        sealed(e, summary, 0, &visits);
    return summary;
}

/* Summarizer._trusted_version, its alias half: 1 when the first value of `t` lies in a storage tainted this
   step (or its address cannot be read), 0 when not, -1 on an error that is not the tensor's. Only read while
   the list is not empty: in a step without aliases, a cached sighting costs nothing more. */
static int in_tainted(Encoder *e, PyObject *t) {
    PyObject *address = read_of(e, t, R_DATA_PTR);
    if (address == NULL)
        return PyErr_ExceptionMatches(PyExc_Exception) ? (PyErr_Clear(), 1) : -1;
    PyObject *extents = PyList_AsTuple(e->tainted); /* a snapshot: the comparisons below run no Python code */
    int in = extents == NULL ? -1 : 0;
    for (Py_ssize_t i = 0; in == 0 && i < PyTuple_GET_SIZE(extents); i++) {
        PyObject *extent = PyTuple_GET_ITEM(extents, i);
        if (!PyTuple_CheckExact(extent) || PyTuple_GET_SIZE(extent) != 2)
            continue;
        int above = PyObject_RichCompareBool(address, PyTuple_GET_ITEM(extent, 0), Py_GE);
        int below = above == 1 ? PyObject_RichCompareBool(address, PyTuple_GET_ITEM(extent, 1), Py_LT) : 0;
        in = above < 0 || below < 0 ? -1 : above && below;
    }
    Py_XDECREF(extents);
    Py_DECREF(address);
    return in;
}

/* Summarizer._cached's flag rule: 1 when `summary` says what `t.requires_grad` says now, 0 when not (a
   `requires_grad_()` since: it does not move the version), -1 on an error that is not the tensor's. */
static int same_grad_flag(Encoder *e, PyObject *t, PyObject *summary) {
    PyObject *held = Py_TYPE(summary) == e->summary_slots.type /* slot 4: SUMMARY_SLOTS' requires_grad */
                         ? slots_get(&e->summary_slots, summary, 4)
                         : NULL;
    if (held == NULL && !PyErr_Occurred())
        held = PyObject_GetAttr(summary, S_requires_grad);
    if (held == NULL)
        return PyErr_ExceptionMatches(PyExc_Exception) ? (PyErr_Clear(), 0) : -1;
    int same = 1; /* a summary without the flag (None) has nothing to keep up to date */
    if (held != Py_None) {
        int now = read_bool(e, t, R_REQUIRES_GRAD);
        same = now >= 0 ? held == (now ? Py_True : Py_False)
                        : PyErr_ExceptionMatches(PyExc_Exception) ? (PyErr_Clear(), 0) : -1;
    }
    Py_DECREF(held);
    return same;
}

/* Summarizer._cached(t): the cached summary while `t` is alive and unchanged, else a new one, cached. */
static PyObject *leaf(Encoder *e, PyObject *t) {
    PyObject *version = read_of(e, t, R_VERSION);
    if (version == NULL) { /* an inference tensor keeps no version counter: summarised, never cached */
        if (!PyErr_ExceptionMatches(PyExc_RuntimeError))
            return NULL;
        PyErr_Clear();
        return fresh_summary(e, t, NULL);
    }
    if (e->tainted != NULL && PyList_GET_SIZE(e->tainted) > 0) {
        int in = in_tainted(e, t);
        if (in != 0) { /* memory that an alias may have written: summarised anew, not cached */
            PyObject *summary = in < 0 ? NULL : fresh_summary(e, t, version);
            Py_DECREF(version);
            return summary;
        }
    }
    PyObject *key = PyLong_FromVoidPtr(t);
    if (key == NULL) {
        Py_DECREF(version);
        return NULL;
    }
    PyObject *entry = PyDict_GetItemWithError(e->cache, key);
    if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 3 &&
        referent_is(PyTuple_GET_ITEM(entry, 0), t)) {
        Py_INCREF(entry); /* held across the comparison */
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, 1), version, Py_EQ);
        if (same > 0)
            same = same_grad_flag(e, t, PyTuple_GET_ITEM(entry, 2));
        if (same != 0) {
            Py_DECREF(key);
            Py_DECREF(version);
            PyObject *summary = same < 0 ? NULL : PyTuple_GET_ITEM(entry, 2);
            Py_XINCREF(summary);
            Py_DECREF(entry);
            return summary;
        }
        Py_DECREF(entry);
    }
    if (PyErr_Occurred())
        goto error;
    PyObject *summary = fresh_summary(e, t, version);
    if (summary == NULL)
        goto error;
    PyObject *ref = PyWeakref_NewRef(t, NULL);
    if (ref == NULL) { /* tensor types that refuse weak references are simply not cached */
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
            Py_DECREF(summary);
            goto error;
        }
        PyErr_Clear();
    } else {
        untrack(ref); /* made without a callback: nothing to visit */
        PyObject *value = PyTuple_Pack(3, ref, version, summary);
        Py_DECREF(ref);
        if (value != NULL && PyLong_CheckExact(version) && !PyObject_GC_IsTracked(summary))
            untrack(value);
        if (value == NULL || PyDict_SetItem(e->cache, key, value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(summary);
            goto error;
        }
        Py_DECREF(value);
    }
    Py_DECREF(key);
    Py_DECREF(version);
    return summary;
error:
    Py_DECREF(key);
    Py_DECREF(version);
    return NULL;
}

/* How many objects one seal() looks at, at most: the encoder's values are small fresh trees (summaries,
   shared, are untracked after their first visit), but a value shared many times over, or a list that holds
   itself, must not make a seal() long. */
#define SEAL_VISITS 100000

/* The slots of a summary or a record (plain __slots__ classes, see _slots.h): 1 when each is sealed. */
static int slots_sealed(Encoder *e, const slots_t *s, PyObject *v, int depth, Py_ssize_t *visits) {
    if (Py_TYPE(v) != s->type)
        return 0; /* another kind of class may hold references elsewhere: leave it tracked */
    int all = 1;
    for (int i = 0; i < s->n; i++) {
        PyObject *item = slots_get(s, v, i); /* the summary holds it too */
        if (item == NULL && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        all &= item == NULL || sealed(e, item, depth + 1, visits);
        Py_XDECREF(item);
    }
    return all;
}

/* 1 when `v` is out of the collector's lists (an atom, or untracked now), 0 when it stays tracked. Lists,
   tuples, str-keyed dicts and summaries (exactly `summary_type`) whose items all are, are taken out (see
   untrack()): bottom up, so a tracked leaf keeps only its own containers tracked. A cycle is never taken
   out: the walk down it ends at the depth limit, which leaves every object on the way tracked. */
static int sealed(Encoder *e, PyObject *v, int depth, Py_ssize_t *visits) {
    if (!PyObject_IS_GC(v) || !PyObject_GC_IsTracked(v))
        return 1;
    if (depth > e->max_depth + 4 || ++*visits > SEAL_VISITS) /* a record's data: 3 levels above its values */
        return 0;
    PyTypeObject *kind = Py_TYPE(v);
    int all = 1;
    if (kind == &PyList_Type || kind == &PyTuple_Type) {
        Py_ssize_t n = kind == &PyList_Type ? PyList_GET_SIZE(v) : PyTuple_GET_SIZE(v);
        for (Py_ssize_t i = 0; i < n; i++)
            all &= sealed(e, kind == &PyList_Type ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i), depth + 1,
                          visits);
    } else if (kind == &PyDict_Type) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(v, &pos, &key, &value))
            all &= PyUnicode_CheckExact(key) && sealed(e, value, depth + 1, visits);
    } else if ((PyObject *)kind == e->summary_type) {
        all = slots_sealed(e, &e->summary_slots, v, depth, visits);
    } else {
        return 0;
    }
    if (all)
        PyObject_GC_UnTrack(v);
    return all;
}

static PyObject *walk(Encoder *e, PyObject *v, int depth);

static PyObject *python_walk(Encoder *e, PyObject *v, int depth) {
    PyObject *level = PyLong_FromLong(depth);
    if (level == NULL)
        return NULL;
    PyObject *out = call_python(e, e->walk, v, level);
    Py_DECREF(level);
    return out;
}

static PyObject *scalar(PyObject *v, PyObject *name) {
    PyObject *out = PyDict_New();
    if (out != NULL && (PyDict_SetItem(out, S_type, name) < 0 || PyDict_SetItem(out, S_value, v) < 0))
        Py_CLEAR(out);
    return out;
}

/* Encoded bools, ints and floats recur: an optimizer passes the same lr, betas and eps to every parameter's
   calls, a model the same dims and flags. Their encodings ({"type": ..., "value": ...}, never changed once
   made: records are only read) are shared through this small table, keyed by the value's bits (so -0.0 and
   0.0, 1 and True stay apart); a collision replaces the entry. A step keeps its records until written, and
   a third of a small step's dicts were such encodings. */
#define SCALAR_MEMO 256
static struct {
    PyObject *encoded;   /* NULL while empty */
    PyTypeObject *kind;  /* bool, int or float */
    uint64_t bits;
} scalar_memo[SCALAR_MEMO];

static PyObject *shared_scalar(PyObject *v, PyTypeObject *kind, PyObject *name) {
    uint64_t bits;
    if (kind == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(v);
        memcpy(&bits, &d, sizeof bits);
    } else {
        int overflow = 0;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (n == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return scalar(v, name); /* beyond 64 bits: not memoised */
        }
        bits = (uint64_t)n;
    }
    size_t slot = (size_t)((bits ^ (bits >> 29) ^ (uintptr_t)kind) * 0x9E3779B97F4A7C15ull >> 56) % SCALAR_MEMO;
    if (scalar_memo[slot].encoded != NULL && scalar_memo[slot].kind == kind && scalar_memo[slot].bits == bits) {
        Py_INCREF(scalar_memo[slot].encoded);
        return scalar_memo[slot].encoded;
    }
    PyObject *out = scalar(v, name);
    if (out != NULL) {
        Py_XSETREF(scalar_memo[slot].encoded, (Py_INCREF(out), out));
        scalar_memo[slot].kind = kind;
        scalar_memo[slot].bits = bits;
    }
    return out;
}

/* `{}`, the encoding of an empty dict (most calls' input_kwargs), shared for the same reason. */
static PyObject *EMPTY_DICT;

/* ValueEncoder._walk, for the values it meets in nearly every call. */
static PyObject *walk(Encoder *e, PyObject *v, int depth) {
    if (is_fast_tensor(e, v))
        return leaf(e, v);
    if (v == Py_None)
        Py_RETURN_NONE;
    PyTypeObject *kind = Py_TYPE(v);
    if (kind == &PyBool_Type)
        return shared_scalar(v, kind, TYPE_NAMES[0]);
    if (kind == &PyLong_Type)
        return shared_scalar(v, kind, TYPE_NAMES[1]);
    if (kind == &PyFloat_Type)
        return shared_scalar(v, kind, TYPE_NAMES[2]);
    if (kind == &PyUnicode_Type)
        return scalar(v, TYPE_NAMES[3]);
    if (kind == &PyTuple_Type || kind == &PyList_Type) {
        if (depth >= e->max_depth)
            Py_RETURN_NONE;
        if (Py_EnterRecursiveCall(" while encoding call values"))
            return NULL;
        /* a list is walked as a snapshot: Python code run meanwhile (a summary) cannot change its length */
        PyObject *items = kind == &PyList_Type ? PyList_AsTuple(v) : (Py_INCREF(v), v);
        Py_ssize_t n = items ? PyTuple_GET_SIZE(items) : 0;
        PyObject *out = items ? PyList_New(n) : NULL;
        for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
            PyObject *item = walk(e, PyTuple_GET_ITEM(items, i), depth + 1);
            if (item == NULL)
                Py_CLEAR(out);
            else
                PyList_SET_ITEM(out, i, item);
        }
        Py_XDECREF(items);
        Py_LeaveRecursiveCall();
        return out;
    }
    if (kind == &PyDict_Type && PyDict_GET_SIZE(v) == 0 && depth < e->max_depth) {
        Py_INCREF(EMPTY_DICT);
        return EMPTY_DICT;
    }
    if (kind == &PyDict_Type && depth < e->max_depth) {
        if (e->lazy) { /* in bare(): a key that is not a str is made one by Python code (str(key)): quietly */
            PyObject *key, *value;
            Py_ssize_t pos = 0;
            while (PyDict_Next(v, &pos, &key, &value))
                if (!PyUnicode_CheckExact(key))
                    return python_walk(e, v, depth);
        }
        if (Py_EnterRecursiveCall(" while encoding call values"))
            return NULL;
        PyObject *out = PyDict_New(), *key, *value;
        Py_ssize_t pos = 0;
        while (out != NULL && PyDict_Next(v, &pos, &key, &value)) {
            Py_INCREF(key);
            Py_INCREF(value);
            PyObject *name = PyUnicode_CheckExact(key) ? (Py_INCREF(key), key) : PyObject_Str(key);
            PyObject *item = name ? walk(e, value, depth + 1) : NULL;
            if (item == NULL || PyDict_SetItem(out, name, item) < 0)
                Py_CLEAR(out);
            Py_XDECREF(item);
            Py_XDECREF(name);
            Py_DECREF(key);
            Py_DECREF(value);
        }
        Py_LeaveRecursiveCall();
        return out;
    }
    return python_walk(e, v, depth);
}

static PyObject *Encoder_encode(Encoder *e, PyObject *value) { return walk(e, value, 0); }

/* Encoder.bare(value): encode(value) for a caller that has made sure no torch-function mode is active (the
   C API handler, inside __torch_function__, when the mode stack is empty): the plain tensors read here
   then dispatch to nothing, and torch-function dispatch is turned off only around the Python routes. */
static PyObject *Encoder_bare(Encoder *e, PyObject *value) {
    if (e->quiet == NULL || e->quiet == Py_None || e->walk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder.bare: the encoder was made without quiet");
        return NULL;
    }
    int lazy = e->lazy;
    e->lazy = 1;
    PyObject *out = walk(e, value, 0);
    e->lazy = lazy;
    return out;
}

static int Encoder_init(Encoder *e, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"tensor_types", "walk", "cache", "summarize", "summary_type", "kinds", "strided",
                            "shape_of", "shapes", "max_depth", "quiet", "crc", "tainted", NULL};
    PyObject *tensor_types, *walk_, *cache, *summarize, *summary_type, *kinds, *strided, *shape_of, *shapes;
    PyObject *quiet = Py_None, *crc = Py_None, *tainted = NULL;
    int max_depth;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OO!OOO!OOO!i|OOO!:Encoder", names, &PyTuple_Type,
                                     &tensor_types, &walk_, &PyDict_Type, &cache, &summarize, &summary_type,
                                     &PyDict_Type, &kinds, &strided, &shape_of, &PyDict_Type, &shapes, &max_depth,
                                     &quiet, &crc, &PyList_Type, &tainted))
        return -1;
    if (crc != Py_None && !PyCallable_Check(crc)) {
        PyErr_SetString(PyExc_TypeError, "Encoder(): crc is zlib_ng.crc32 (summary_mode md5) or None");
        return -1;
    }
    slots_t summary_slots = {0}; /* kept below, once all is checked: a failed re-init leaves the encoder as it was */
    if (slots_find(&summary_slots, summary_type, SUMMARY_SLOTS, 6) < 0)
        return -1;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kinds, &pos, &key, &value)) {
        if (!PyTuple_CheckExact(value) || PyTuple_GET_SIZE(value) != 2 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(value, 0)) || !PyUnicode_CheckExact(PyTuple_GET_ITEM(value, 1))) {
            PyErr_SetString(PyExc_TypeError, "Encoder(): kinds maps a dtype to (kernel kind, dtype name)");
            slots_clear(&summary_slots);
            return -1;
        }
        long k = PyLong_AsLong(PyTuple_GET_ITEM(value, 0));
        if (k < 0 || k > KIND_BOOL) {
            PyErr_SetString(PyExc_ValueError, "Encoder(): kinds are 0 (float32), 1 (float64), 2 (bfloat16), "
                                              "3 (int64), 4 (bool)");
            slots_clear(&summary_slots);
            return -1;
        }
    }
#define KEEP(field, value_) Py_INCREF(value_); Py_XSETREF(e->field, value_);
    KEEP(tensor_types, tensor_types);
    find_reads(tensor_types, e->reads);
    KEEP(walk, walk_);
    KEEP(cache, cache);
    KEEP(summarize, summarize);
    KEEP(summary_type, summary_type);
    slots_clear(&e->summary_slots);
    e->summary_slots = summary_slots;
    PyObject *own_kinds = PyDict_Copy(kinds); /* checked above; later changes to the caller's dict stay there */
    if (own_kinds == NULL)
        return -1;
    Py_XSETREF(e->kinds, own_kinds);
    KEEP(strided, strided);
    KEEP(shape_of, shape_of);
    KEEP(shapes, shapes);
    e->max_depth = max_depth;
    KEEP(quiet, quiet);
    KEEP(crc, crc);
    Py_XINCREF(tainted);
    Py_XSETREF(e->tainted, tainted);
    return 0;
}

static int Encoder_traverse(Encoder *e, visitproc visit, void *arg) {
    Py_VISIT(e->tensor_types);
    Py_VISIT(e->walk);
    Py_VISIT(e->cache);
    Py_VISIT(e->summarize);
    Py_VISIT(e->summary_type);
    Py_VISIT(e->kinds);
    Py_VISIT(e->strided);
    Py_VISIT(e->shape_of);
    Py_VISIT(e->shapes);
    Py_VISIT(e->quiet);
    Py_VISIT(e->crc);
    Py_VISIT(e->tainted);
    for (int i = 0; i < N_READS; i++)
        Py_VISIT(e->reads[i]);
    Py_VISIT(e->storage_type);
    Py_VISIT(e->storage_reads[0]);
    Py_VISIT(e->storage_reads[1]);
    return 0;
}

static int Encoder_clear(Encoder *e) {
    Py_CLEAR(e->tensor_types);
    Py_CLEAR(e->walk);
    Py_CLEAR(e->cache);
    Py_CLEAR(e->summarize);
    Py_CLEAR(e->summary_type);
    Py_CLEAR(e->kinds);
    Py_CLEAR(e->strided);
    Py_CLEAR(e->shape_of);
    Py_CLEAR(e->shapes);
    Py_CLEAR(e->quiet);
    Py_CLEAR(e->crc);
    Py_CLEAR(e->tainted);
    for (int i = 0; i < N_READS; i++)
        Py_CLEAR(e->reads[i]);
    Py_CLEAR(e->storage_type);
    Py_CLEAR(e->storage_reads[0]);
    Py_CLEAR(e->storage_reads[1]);
    slots_clear(&e->summary_slots);
    slots_clear(&e->record_slots);
    return 0;
}

static void Encoder_dealloc(Encoder *e) {
    PyObject_GC_UnTrack(e);
    Encoder_clear(e);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *Encoder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Encoder *e = (Encoder *)type->tp_alloc(type, 0);
    return (PyObject *)e; /* fields are NULL until __init__ */
}

static PyObject *Encoder_call(Encoder *e, PyObject *args, PyObject *kwargs) {
    PyObject *value;
    if (e->walk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder was not initialised");
        return NULL;
    }
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "Encoder(value) takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "Encoder", 1, 1, &value))
        return NULL;
    return Encoder_encode(e, value);
}

/* Encoder.seal(record): a finished forward record out of the garbage collector's lists (see untrack()). */
static PyObject *Encoder_seal(Encoder *e, PyObject *record) {
    if (e->summary_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder was not initialised");
        return NULL;
    }
    if (Py_TYPE(record) != e->record_slots.type &&
        slots_find(&e->record_slots, (PyObject *)Py_TYPE(record), RECORD_SLOTS, 2) < 0)
        return NULL;
    Py_ssize_t visits = 0;
    if (slots_sealed(e, &e->record_slots, record, 0, &visits)) /* a Record's: its name and its data */
        untrack(record);
    Py_RETURN_NONE;
}

static PyMethodDef ENCODER_METHODS[] = {
    {"bare", (PyCFunction)Encoder_bare, METH_O,
     "bare(value): encode(value) when no torch-function mode is active; torch-function dispatch is turned off "
     "around the Python routes only (quiet, given when the encoder was made)."},
    {"seal", (PyCFunction)Encoder_seal, METH_O,
     "seal(record): takes a finished record (its data, and the record itself) out of the garbage collector's "
     "lists, as far as every leaf of its data can be: records live until the step is written, and every "
     "object that survives young collections brings a full one nearer. Dicts track themselves again when a "
     "tracked value is put in; lists do not: a sealed record's lists must not be given new items."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "msprobe_lite.pytorch._fast_encode.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Encoder(tensor_types, walk, cache, summarize, summary_type, kinds, strided, shape_of, shapes, "
              "max_depth, quiet=None, crc=None, tainted=None)\n\n"
              "Called with a value, returns it encoded as ValueEncoder.encode(value, summarizer._tensor_leaf) "
              "would (see the module's docstring).",
    .tp_new = Encoder_new,
    .tp_init = (initproc)Encoder_init,
    .tp_call = (ternaryfunc)Encoder_call,
    .tp_methods = ENCODER_METHODS,
    .tp_traverse = (traverseproc)Encoder_traverse,
    .tp_clear = (inquiry)Encoder_clear,
    .tp_dealloc = (destructor)Encoder_dealloc,
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fast_encode",
                                    "Call values to dump values with tensor summaries, in C (see "
                                    "pytorch/summary.py).",
                                    -1, NULL};

PyMODINIT_FUNC PyInit__fast_encode(void) {
    STATS = import_fast_stats();
    if (STATS == NULL)
        return NULL;
    for (int i = 0; i < N_READS; i++)
        INTERN(READ_STRS[i], READ_NAMES[i]);
    INTERN(S_type, "type");
    INTERN(S_value, "value");
    if (EMPTY_DICT == NULL && (EMPTY_DICT = PyDict_New()) == NULL)
        return NULL;
    INTERN(S_torch_tensor, "torch.Tensor");
    INTERN(S_requires_grad, "requires_grad");
    INTERN(S_nbytes, "nbytes");
    INTERN(TYPE_NAMES[0], "bool");
    INTERN(TYPE_NAMES[1], "int");
    INTERN(TYPE_NAMES[2], "float");
    INTERN(TYPE_NAMES[3], "str");
    return module_with_type(&MODULE, "Encoder", &EncoderType);
}
