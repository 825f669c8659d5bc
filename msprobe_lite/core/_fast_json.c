/* The record lines of dump.json, formatted in C: the same bytes as core/writer.py's Python route.

Why C: formatting a step's records is one of the largest costs of a dumped step in Python (a few hundred
records a step, each a nest of lists, dicts and tensor summaries; docs/performance.md, "The C routes"). Floats go through PyOS_double_to_string, float.__repr__'s own function.

What is formatted here: exact dicts with str keys, lists, str, float, int, bool and None, and tensor
summaries whose fields have their usual types (see summary()). Anything else (a non-str key, a subclass, an
unusual summary field) is handed back to Python (`fallback(value)`, or the summary's own `json_text()`),
so the output is json.dumps(..., ensure_ascii=True) byte for byte in every case.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "_fast_stats.h"
#include "_module.h"
#include "_slots.h"

/* The output, built in a PyMem buffer that grows by doubling; the bytes object is made once at the end. */
typedef struct {
    char *data; /* NULL until the first write */
    Py_ssize_t len, cap;
} buf_t;

static int grow(buf_t *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + extra)
        cap *= 2;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int put(buf_t *b, const char *text, Py_ssize_t n) {
    if (grow(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, text, n);
    b->len += n;
    return 0;
}

#define PUT(b, literal) put((b), (literal), (Py_ssize_t)sizeof(literal) - 1)

/* Python's text of `obj` (already JSON, ASCII: json.dumps with ensure_ascii, or json_text()). */
static int put_text(buf_t *b, PyObject *text) {
    if (text == NULL)
        return -1;
    Py_ssize_t n;
    const char *s = PyUnicode_Check(text) ? PyUnicode_AsUTF8AndSize(text, &n) : NULL;
    int rc = s == NULL ? -1 : put(b, s, n);
    if (s == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "JSON text must be a str");
    Py_DECREF(text);
    return rc;
}

/* json.encoder.encode_basestring_ascii: quotes, backslash escapes, \u00XX for other control characters.
   Strings with non-ASCII characters (escaped as \uXXXX surrogate pairs) go to Python's own function. */
static int put_str(buf_t *b, PyObject *s, PyObject *escape) {
    if (!PyUnicode_IS_ASCII(s))
        return put_text(b, PyObject_CallOneArg(escape, s));
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    const unsigned char *c = PyUnicode_1BYTE_DATA(s);
    if (grow(b, 6 * n + 2) < 0)
        return -1;
    char *out = b->data + b->len;
    *out++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char ch = c[i];
        if (ch >= 0x20 && ch <= 0x7e && ch != '"' && ch != '\\') { /* json's S_CHAR: DEL is escaped too */
            *out++ = (char)ch;
            continue;
        }
        *out++ = '\\';
        switch (ch) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        default: out += sprintf(out, "u%04x", ch);
        }
    }
    *out++ = '"';
    b->len = out - b->data;
    return 0;
}

static FastStatsApi *STATS; /* NULL when _fast_stats is not built */

/* float.__repr__ for finite values (the same call it makes), json's NaN / Infinity / -Infinity otherwise. */
static int put_float(buf_t *b, double v) {
    if (!isfinite(v)) {
        if (isnan(v))
            return PUT(b, "NaN");
        return v > 0 ? PUT(b, "Infinity") : PUT(b, "-Infinity");
    }
    char *text = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL)
        return -1;
    int rc = put(b, text, (Py_ssize_t)strlen(text));
    PyMem_Free(text);
    return rc;
}

/* Decimal digits of `n` written at `out` (no sign), backwards from a local buffer: snprintf's format parsing
   cost more than the rest of a shape. Returns how many. */
static int put_digits(char *out, unsigned long long n) {
    char digits[24];
    int nd = 0;
    do {
        digits[nd++] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    for (int i = 0; i < nd; i++)
        out[i] = digits[nd - 1 - i];
    return nd;
}

static int put_int(buf_t *b, PyObject *v) {
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow)
        return put_text(b, PyObject_Repr(v));
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (grow(b, 24) < 0)
        return -1;
    char *out = b->data + b->len;
    if (n < 0)
        *out++ = '-';
    out += put_digits(out, n < 0 ? 0ull - (unsigned long long)n : (unsigned long long)n);
    b->len = out - b->data;
    return 0;
}

/* The exact scalar types json_scalar() formats; 1 when `v` was one of them, 0 when not, -1 on error. */
static int put_scalar(buf_t *b, PyObject *v) {
    if (PyFloat_CheckExact(v))
        return put_float(b, PyFloat_AS_DOUBLE(v)) < 0 ? -1 : 1;
    if (v == Py_None)
        return PUT(b, "null") < 0 ? -1 : 1;
    if (PyBool_Check(v))
        return (v == Py_True ? PUT(b, "true") : PUT(b, "false")) < 0 ? -1 : 1;
    if (PyLong_CheckExact(v))
        return put_int(b, v) < 0 ? -1 : 1;
    return 0;
}

/* Summaries already written by this call of record_lines, and where their text is in the buffer: an
   open-addressing table keyed by the object's address. Each key is held (a new reference) until the call
   ends, so no address is reused meanwhile. */
typedef struct {
    PyObject *key;
    Py_ssize_t offset, length;
} seen_entry;

typedef struct {
    seen_entry *entries; /* NULL until the first summary */
    size_t mask, used;   /* capacity - 1 (a power of two), entries in use */
} seen_t;

static seen_entry *seen_slot(seen_t *t, PyObject *key) {
    size_t i = ((size_t)key >> 4) * 0x9E3779B97F4A7C15ull >> 7;
    for (;; i++) {
        seen_entry *e = &t->entries[i & t->mask];
        if (e->key == key || e->key == NULL)
            return e;
    }
}

/* The entry of `key`: its text's place when e->key == key, else an empty entry to fill (NULL: no memory). */
static seen_entry *seen_find(seen_t *t, PyObject *key) {
    if (t->entries == NULL || 2 * (t->used + 1) > t->mask + 1) { /* at most half full */
        size_t cap = t->entries ? 2 * (t->mask + 1) : 1024;
        seen_entry *old = t->entries, *fresh = PyMem_Calloc(cap, sizeof(seen_entry));
        if (fresh == NULL)
            return (seen_entry *)PyErr_NoMemory();
        size_t old_cap = old ? t->mask + 1 : 0;
        t->entries = fresh;
        t->mask = cap - 1;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].key != NULL)
                *seen_slot(t, old[i].key) = old[i];
        PyMem_Free(old);
    }
    return seen_slot(t, key);
}

static void seen_clear(seen_t *t) {
    for (size_t i = 0; t->entries != NULL && i <= t->mask; i++)
        Py_XDECREF(t->entries[i].key);
    PyMem_Free(t->entries);
    t->entries = NULL;
}

typedef struct {
    PyObject *summary_type, *saved_type, *fallback, *escape;
    seen_t seen;
    slots_t summary_slots; /* TensorSummary's fields read in place when it is a plain __slots__ class */
    slots_t record_slots;  /* the same for the records' class (that of the first record) */
} kinds_t;

static void kinds_clear(kinds_t *k) {
    seen_clear(&k->seen);
    slots_clear(&k->summary_slots);
    slots_clear(&k->record_slots);
}

static const char *const SUMMARY_FIELDS[] = {"type", "dtype", "shape", "stats", "requires_grad", "md5"};
static const char *const RECORD_FIELDS[] = {"name", "data"};

/* `obj.<names[i]>` as a new reference: read from its slot when `obj` is exactly the class of `s` and the slot
   is set (no attribute lookup), else through getattr. */
static PyObject *field(PyObject *obj, const slots_t *s, int i, PyObject *name) {
    PyObject *v = Py_TYPE(obj) == s->type ? slots_get(s, obj, i) : NULL;
    return v != NULL || PyErr_Occurred() ? v : PyObject_GetAttr(obj, name);
}

static PyObject *S_type, *S_dtype, *S_shape, *S_stats, *S_requires_grad, *S_md5, *S_summary, *S_data_name,
    *S_json_text, *S_name, *S_data;
static const char *STAT_KEYS[4] = {", \"Max\": ", ", \"Min\": ", ", \"Mean\": ", ", \"Norm\": "};
static const Py_ssize_t STAT_KEY_LENGTHS[4] = {9, 9, 10, 10};

/* TensorSummary.json_text(data_name) when every field has its usual type; 0 when one has not (the caller
   then asks the summary itself), -1 on error. Written at the end of `b` and rolled back on 0. */
static int summary(buf_t *b, PyObject *s, PyObject *data_name, kinds_t *k) {
    Py_ssize_t start = b->len;
    int rc = 0;
    const slots_t *f = &k->summary_slots;
    PyObject *type = field(s, f, 0, S_type), *dtype = type ? field(s, f, 1, S_dtype) : NULL,
             *shape = dtype ? field(s, f, 2, S_shape) : NULL, *stats = shape ? field(s, f, 3, S_stats) : NULL,
             *grad = stats ? field(s, f, 4, S_requires_grad) : NULL, *md5 = grad ? field(s, f, 5, S_md5) : NULL;
    if (!type || !dtype || !shape || !stats || !grad || !md5) {
        rc = -1;
        goto done;
    }
    if (!PyUnicode_CheckExact(type) || !PyUnicode_CheckExact(dtype) || (!PyTuple_Check(shape) && !PyList_CheckExact(shape)))
        goto done;
    int packed = STATS != NULL && Py_TYPE(stats) == STATS->stats_type; /* four finite doubles in place */
    if (!(stats == Py_None || packed || (PyTuple_CheckExact(stats) && PyTuple_GET_SIZE(stats) == 4)))
        goto done;
    if (!(grad == Py_None || PyBool_Check(grad)) || !(md5 == Py_None || PyUnicode_CheckExact(md5)))
        goto done;
    if (!(data_name == NULL || PyUnicode_CheckExact(data_name)))
        goto done;
    if (PUT(b, "{\"type\": ") < 0 || put_str(b, type, k->escape) < 0 || PUT(b, ", \"dtype\": ") < 0 ||
        put_str(b, dtype, k->escape) < 0 || PUT(b, ", \"shape\": [") < 0)
        goto error;
    Py_ssize_t dims = PySequence_Fast_GET_SIZE(shape);
    for (Py_ssize_t i = 0; i < dims; i++) {
        PyObject *d = PySequence_Fast_GET_ITEM(shape, i);
        if (!PyLong_CheckExact(d))
            goto rollback; /* json.dumps of an odd shape: Python's business */
        if ((i && PUT(b, ", ") < 0) || put_int(b, d) < 0)
            goto error;
    }
    if (PUT(b, "]") < 0)
        goto error;
    if (stats != Py_None) {
        for (int i = 0; i < 4; i++) {
            if (put(b, STAT_KEYS[i], STAT_KEY_LENGTHS[i]) < 0)
                goto error;
            if (packed) {
                if (put_float(b, ((StatsObject *)stats)->values[i]) < 0)
                    goto error;
                continue;
            }
            int done = put_scalar(b, PyTuple_GET_ITEM(stats, i));
            if (done < 0)
                goto error;
            if (done == 0)
                goto rollback;
        }
    }
    if (grad != Py_None && (grad == Py_True ? PUT(b, ", \"requires_grad\": true")
                                            : PUT(b, ", \"requires_grad\": false")) < 0)
        goto error;
    if (data_name != NULL && (PUT(b, ", \"data_name\": ") < 0 || put_str(b, data_name, k->escape) < 0))
        goto error;
    if (md5 != Py_None && (PUT(b, ", \"md5\": ") < 0 || put_str(b, md5, k->escape) < 0))
        goto error;
    rc = PUT(b, "}") < 0 ? -1 : 1;
    goto done;
error:
    rc = -1;
    goto done;
rollback:
    b->len = start;
    rc = 0;
done:
    Py_XDECREF(type);
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(stats);
    Py_XDECREF(grad);
    Py_XDECREF(md5);
    return rc;
}

static int value(buf_t *b, PyObject *v, kinds_t *k);

/* A TensorSummary or SavedTensor. The output of one call is the input of the next, so the same summary
   recurs in several records: its text is made once per call of record_lines and copied after that. */
static int tensor_item(buf_t *b, PyObject *v, kinds_t *k) {
    seen_entry *where = seen_find(&k->seen, v);
    if (where == NULL)
        return -1;
    if (where->key == v) {
        Py_ssize_t offset = where->offset, n = where->length;
        if (grow(b, n) < 0)
            return -1;
        memcpy(b->data + b->len, b->data + offset, n); /* grow() first: it may move the buffer */
        b->len += n;
        return 0;
    }
    Py_ssize_t start = b->len;
    int rc;
    if (Py_TYPE(v) == (PyTypeObject *)k->saved_type) {
        PyObject *inner = PyObject_GetAttr(v, S_summary), *name = PyObject_GetAttr(v, S_data_name);
        rc = !inner || !name                                        ? -1
             : Py_TYPE(inner) == (PyTypeObject *)k->summary_type ? summary(b, inner, name, k)
                                                                 : 0;
        Py_XDECREF(inner);
        Py_XDECREF(name);
    } else {
        rc = summary(b, v, NULL, k);
    }
    if (rc == 0) /* an unusual field: the summary's own json_text() */
        rc = put_text(b, PyObject_CallMethodNoArgs(v, S_json_text)) < 0 ? -1 : 1;
    if (rc > 0) { /* found again: Python code run above (json_text, an escape) may have filled the table */
        if ((where = seen_find(&k->seen, v)) == NULL)
            return -1;
        if (where->key == NULL) {
            Py_INCREF(v);
            where->key = v;
            where->offset = start;
            where->length = b->len - start;
            k->seen.used++;
        }
    }
    return rc < 0 ? -1 : 0;
}

static int item(buf_t *b, PyObject *v, kinds_t *k) {
    PyTypeObject *kind = Py_TYPE(v);
    if ((PyObject *)kind == k->summary_type || (PyObject *)kind == k->saved_type)
        return tensor_item(b, v, k);
    if (PyUnicode_CheckExact(v))
        return put_str(b, v, k->escape);
    if (PyList_CheckExact(v) || PyDict_CheckExact(v))
        return value(b, v, k);
    int done = put_scalar(b, v);
    if (done != 0)
        return done < 0 ? -1 : 0;
    return put_text(b, PyObject_CallOneArg(k->fallback, v));
}

/* writer.value_json: lists and str-keyed dicts joined here, their items through item(). */
static int value(buf_t *b, PyObject *v, kinds_t *k) {
    if (Py_EnterRecursiveCall(" while formatting a dump record"))
        return -1;
    int rc = 0;
    if (PyList_CheckExact(v)) {
        rc = PUT(b, "[");
        for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(v); i++) {
            if (i)
                rc = PUT(b, ", ");
            PyObject *it = PyList_GET_ITEM(v, i);
            Py_INCREF(it); /* a gradient hook on another thread may replace it while Python code runs */
            if (rc == 0)
                rc = item(b, it, k);
            Py_DECREF(it);
        }
        if (rc == 0)
            rc = PUT(b, "]");
    } else if (PyDict_CheckExact(v)) {
        PyObject *key, *val;
        Py_ssize_t pos = 0;
        while (PyDict_Next(v, &pos, &key, &val)) {
            if (!PyUnicode_CheckExact(key)) { /* json's rules for other keys: the whole dict in Python */
                rc = put_text(b, PyObject_CallOneArg(k->fallback, v));
                Py_LeaveRecursiveCall();
                return rc;
            }
        }
        pos = 0;
        rc = PUT(b, "{");
        for (int first = 1; rc == 0 && PyDict_Next(v, &pos, &key, &val); first = 0) {
            if (!PyUnicode_CheckExact(key)) { /* a key added meanwhile by another thread */
                PyErr_SetString(PyExc_RuntimeError, "a record changed while it was written");
                rc = -1;
                break;
            }
            Py_INCREF(val); /* the dict may change under a fallback call */
            rc = (first ? 0 : PUT(b, ", ")) || put_str(b, key, k->escape) || PUT(b, ": ") || item(b, val, k) ? -1 : 0;
            Py_DECREF(val);
        }
        if (rc == 0)
            rc = PUT(b, "}");
    } else {
        rc = item(b, v, k);
    }
    Py_LeaveRecursiveCall();
    return rc < 0 ? -1 : 0;
}

static PyObject *record_lines(PyObject *self, PyObject *args) {
    PyObject *records;
    kinds_t k = {0};
    if (!PyArg_ParseTuple(args, "OOOOO:record_lines", &records, &k.summary_type, &k.saved_type, &k.fallback,
                          &k.escape))
        return NULL;
    PyObject *seq = PySequence_Tuple(records); /* a snapshot: Python code run meanwhile cannot shorten it */
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    buf_t b = {NULL, 0, 0};
    if (slots_find(&k.summary_slots, k.summary_type, SUMMARY_FIELDS, 6) < 0 ||
        (n > 0 && slots_find(&k.record_slots, (PyObject *)Py_TYPE(PyTuple_GET_ITEM(seq, 0)), RECORD_FIELDS, 2) < 0) ||
        (n > 0 && grow(&b, n < (1 << 14) ? n * 1024 : (Py_ssize_t)1 << 24) < 0)) { /* most records take less */
        Py_DECREF(seq);
        kinds_clear(&k);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyTuple_GET_ITEM(seq, i);
        PyObject *name = field(r, &k.record_slots, 0, S_name), *data = name ? field(r, &k.record_slots, 1, S_data) : NULL;
        int rc = data == NULL ? -1 : 0;
        if (rc == 0 && !PyUnicode_Check(name)) {
            PyErr_Format(PyExc_TypeError, "a record's name must be a str, not %.100s", Py_TYPE(name)->tp_name);
            rc = -1;
        }
        if (rc == 0)
            rc = (i ? PUT(&b, ",\n") : 0) || (PyUnicode_CheckExact(name) ? put_str(&b, name, k.escape)
                                                                      : put_text(&b, PyObject_CallOneArg(k.escape, name)))
                 || PUT(&b, ": ") || value(&b, data, &k);
        Py_XDECREF(name);
        Py_XDECREF(data);
        if (rc) {
            PyMem_Free(b.data);
            Py_DECREF(seq);
            kinds_clear(&k);
            return NULL;
        }
    }
    Py_DECREF(seq);
    kinds_clear(&k);
    PyObject *text = PyBytes_FromStringAndSize(b.data ? b.data : "", b.len);
    PyMem_Free(b.data);
    return text;
}

static PyMethodDef METHODS[] = {
    {"record_lines", record_lines, METH_VARARGS,
     "record_lines(records, TensorSummary, SavedTensor, fallback, escape) -> bytes\n\n"
     "'\"name\": {data}' for each record (objects with `name` and `data`), joined by ',\\n', as "
     "core.writer formats them. fallback(value) -> JSON text for values formatted in Python; escape(str) -> "
     "json.encoder.encode_basestring_ascii."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fast_json",
                                    "dump.json record lines in C (see core/writer.py).", -1, METHODS};

PyMODINIT_FUNC PyInit__fast_json(void) {
    INTERN(S_type, "type");
    INTERN(S_dtype, "dtype");
    INTERN(S_shape, "shape");
    INTERN(S_stats, "stats");
    INTERN(S_requires_grad, "requires_grad");
    INTERN(S_md5, "md5");
    INTERN(S_summary, "summary");
    INTERN(S_data_name, "data_name");
    INTERN(S_json_text, "json_text");
    INTERN(S_name, "name");
    INTERN(S_data, "data");
    /* Stats objects are formatted from their doubles; without _fast_stats (an optional extension) there are
       none to meet. */
    STATS = import_fast_stats();
    if (STATS == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ImportError) && !PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
    }
    return PyModule_Create(&MODULE);
}
