/* The usual record's rows of compare/table.py (_Builder._usual), and its usual lines (_Lines.line), in C.

Why C: a large dump has hundreds of thousands of leaves, and in Python each is a dozen dict probes, type
tests, a key tuple and six appends. Here a usual leaf (a tensor of a class met before with four float
statistics and no md5, or a value of a class met before) costs no Python call; what is met for the first
time (a suffix, a tensor or value class) calls back into the builder's own methods, so the rules for it stay
written once, in Python. Likewise a usual line (ASCII, a plain name, a record that orjson reads) costs one
call, to orjson; any other line is handed to _Lines.line itself.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_module.h"

static PyObject *s_type, *s_dtype, *s_shape, *s_md5, *s_data_name, *s_requires_grad, *s_empty, *s_stats[4];
static PyObject *s_hex, *s_done, *s_offset, *s_comma, *s_closed, *s_line, *s_fast_loads;
static PyObject *builtin_sum;

/* After a failed call: 0 (the record is not usual) for the KeyError and TypeError that _usual's `except`
   answers False to, -1 (the exception stays set) for anything else, which _usual lets through too. */
static int not_usual_or_error(void) {
    if (PyErr_ExceptionMatches(PyExc_KeyError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

#define ROWS_FIELDS(X)                                                                                       \
    X(builder) X(suffix) X(row_class) X(stats) X(tensor_classes) X(suffix_codes) X(value_classes) X(objs)    \
        X(values) X(new_suffix) X(value_class) X(tensor_class) X(plain_name) X(no_stats) X(names) X(plans)     \
            X(spans_append) X(parts_append) X(first_row_append) X(plan) X(other_rows) X(flush)

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *builder;                    /* read for its `done` only: the rest is kept here */
    PyObject *suffix, *row_class, *stats; /* its row lists, appended to in place */
    PyObject *tensor_classes, *suffix_codes, *value_classes, *objs, *values;
    PyObject *new_suffix, *value_class, *tensor_class; /* its methods for what is new */
    PyObject *plain_name;                              /* rows.plain_file_name */
    PyObject *no_stats;                                /* the tuple a row without statistics adds to stats */
    /* for Rows.lines, which adds records as _Builder.add does */
    PyObject *names, *plans;                                    /* its list and dict */
    PyObject *spans_append, *parts_append, *first_row_append;   /* its arrays' append */
    PyObject *plan, *other_rows, *flush;                        /* its methods */
    Py_ssize_t batch;                                           /* rows gathered before a flush */
} Rows;

/* dict[key], or make(key) where the dict has no such key: a new reference, or NULL with an exception set. */
static PyObject *kept_or_made(PyObject *dict, PyObject *key, PyObject *make) {
    PyObject *value = PyDict_GetItemWithError(dict, key);
    if (value != NULL) {
        Py_INCREF(value);
        return value;
    }
    return PyErr_Occurred() ? NULL : PyObject_CallOneArg(make, key);
}

/* The suffix code of `text` (a new reference): the builder's dict holds it, or its _suffix makes it. */
static PyObject *suffix_code(Rows *r, PyObject *text) {
    if (text == NULL)
        return NULL;
    PyObject *code = kept_or_made(r->suffix_codes, text, r->new_suffix);
    Py_DECREF(text);
    return code;
}

/* rows.plain_file_name of a `data_name`: 1, 0, -1 with an exception set. Exact text is tested here. */
static int plain_name(Rows *r, PyObject *name) {
    if (!PyUnicode_CheckExact(name)) {
        PyObject *ok = PyObject_CallOneArg(r->plain_name, name);
        int answer = ok == NULL ? -1 : PyObject_IsTrue(ok);
        Py_XDECREF(ok);
        return answer;
    }
    if (PyUnicode_GET_LENGTH(name) == 0 || PyUnicode_CompareWithASCIIString(name, ".") == 0 ||
        PyUnicode_CompareWithASCIIString(name, "..") == 0)
        return 0;
    const Py_UCS4 separators[] = {'/', '\\', '\0'};
    for (int i = 0; i < 3; i++) {
        Py_ssize_t at = PyUnicode_FindChar(name, separators[i], 0, PyUnicode_GET_LENGTH(name), 1);
        if (at != -1)
            return at == -2 ? -1 : 0;
    }
    return 1;
}

/* Whether sum(shape) is an int, as _usual asks (1, 0, -1 with an exception set): sizes that are ints or bools
   are, anything else is left to sum() itself. */
static int sums_to_int(PyObject *shape) {
    Py_ssize_t n = PyList_GET_SIZE(shape), i = 0;
    while (i < n && (PyLong_CheckExact(PyList_GET_ITEM(shape, i)) || PyBool_Check(PyList_GET_ITEM(shape, i))))
        i++;
    if (i == n)
        return 1;
    PyObject *total = PyObject_CallOneArg(builtin_sum, shape);
    if (total == NULL)
        return not_usual_or_error();
    int is_int = PyLong_CheckExact(total);
    Py_DECREF(total);
    return is_int;
}

/* The class key _usual looks tensor_classes up by: (dtype, requires_grad is True, role, *shape). */
static PyObject *tensor_key(PyObject *dtype, PyObject *grad, PyObject *role, PyObject *shape) {
    Py_ssize_t n = PyList_GET_SIZE(shape);
    PyObject *key = PyTuple_New(3 + n);
    if (key == NULL)
        return NULL;
    PyObject *head[3] = {dtype, grad, role};
    for (Py_ssize_t i = 0; i < 3 + n; i++) {
        PyObject *item = i < 3 ? head[i] : PyList_GET_ITEM(shape, i - 3);
        Py_INCREF(item);
        PyTuple_SET_ITEM(key, i, item);
    }
    return key;
}

/* tensor_row once the leaf's dtype, shape and statistics are held: held[] = dtype, shape, Max, Min, Mean, Norm. */
static int tensor_row_held(Rows *r, PyObject *code, PyObject *leaf, PyObject *role, PyObject **held) {
    PyObject *dtype = held[0], *shape = held[1];
    for (int i = 2; i < 6; i++)
        if (!PyFloat_CheckExact(held[i]))
            return 0; /* rarer tensors (integer or null statistics) through rows.Row */
    int has_md5 = PyDict_Contains(leaf, s_md5);
    if (has_md5 != 0)
        return has_md5 < 0 ? not_usual_or_error() : 0;
    PyObject *file_name = PyDict_GetItemWithError(leaf, s_data_name);
    if (file_name == NULL && PyErr_Occurred())
        return not_usual_or_error();
    if (file_name != NULL && file_name != Py_None) {
        Py_INCREF(file_name);
        int plain = plain_name(r, file_name);
        Py_DECREF(file_name);
        if (plain != 1)
            return plain < 0 ? not_usual_or_error() : 0;
    }
    if (!PyList_CheckExact(shape))
        return 0;
    int sums = sums_to_int(shape);
    if (sums != 1)
        return sums;
    PyObject *grad = PyDict_GetItemWithError(leaf, s_requires_grad);
    if (grad == NULL && PyErr_Occurred())
        return not_usual_or_error();
    PyObject *key = tensor_key(dtype, grad == Py_True ? Py_True : Py_False, role, shape);
    if (key == NULL)
        return -1;
    PyObject *cls = PyDict_GetItemWithError(r->tensor_classes, key); /* TypeError: a dtype that is a list */
    if (cls != NULL && cls != Py_None)
        Py_INCREF(cls);
    else if (!PyErr_Occurred()) /* a class not met before: the builder tests it as rows.Row does, or None */
        cls = PyObject_CallFunctionObjArgs(r->tensor_class, key, leaf, role, NULL);
    Py_DECREF(key);
    if (cls == NULL)
        return not_usual_or_error();
    int answer = cls == Py_None                                                                        ? 0
                 : PyList_Append(r->suffix, code) == 0 && PyList_Append(r->row_class, cls) == 0 &&
                         PyList_Append(r->stats, held[2]) == 0 && PyList_Append(r->stats, held[3]) == 0 &&
                         PyList_Append(r->stats, held[4]) == 0 && PyList_Append(r->stats, held[5]) == 0
                     ? 1
                     : -1;
    Py_DECREF(cls);
    return answer;
}

/* The tensor leaf's row appended when it is usual (1), else 0; -1 with an exception set. The objects it reads
   are held while Python code may run (sum(), the callbacks). */
static int tensor_row(Rows *r, PyObject *code, PyObject *leaf, PyObject *role) {
    PyObject *keys[6] = {s_dtype, s_shape, s_stats[0], s_stats[1], s_stats[2], s_stats[3]}, *held[6];
    int n = 0, answer = 1;
    for (; n < 6; n++) {
        if ((held[n] = PyDict_GetItemWithError(leaf, keys[n])) == NULL) { /* a missing statistic: a KeyError */
            answer = PyErr_Occurred() ? not_usual_or_error() : 0;
            break;
        }
        Py_INCREF(held[n]);
    }
    if (answer == 1)
        answer = tensor_row_held(r, code, leaf, role, held);
    while (n > 0)
        Py_DECREF(held[--n]);
    return answer;
}

/* _Builder._shared(obj) (a new reference): the first value object met with the same content, by a key of
   (name, type, value) triples where a float is its hex text; `obj` itself when a value is unhashable. */
static PyObject *shared(Rows *r, PyObject *obj) {
    PyObject *items = PyDict_Items(obj), *key = items ? PyTuple_New(PyList_GET_SIZE(items)) : NULL;
    for (Py_ssize_t i = 0; key != NULL && i < PyTuple_GET_SIZE(key); i++) {
        PyObject *item = PyList_GET_ITEM(items, i), *k = PyTuple_GET_ITEM(item, 0), *v = PyTuple_GET_ITEM(item, 1);
        PyObject *value = PyFloat_CheckExact(v) ? PyObject_CallMethodNoArgs(v, s_hex) : (Py_INCREF(v), v);
        PyObject *triple = value ? PyTuple_Pack(3, k, (PyObject *)Py_TYPE(v), value) : NULL;
        Py_XDECREF(value);
        if (triple == NULL)
            Py_CLEAR(key);
        else
            PyTuple_SET_ITEM(key, i, triple);
    }
    Py_XDECREF(items);
    if (key == NULL)
        return NULL;
    PyObject *kept = PyDict_SetDefault(r->values, key, obj);
    Py_DECREF(key);
    if (kept == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) { /* a value holding a list or an object */
        PyErr_Clear();
        kept = obj;
    }
    Py_XINCREF(kept);
    return kept;
}

/* _Builder._value_row: the row of a value leaf ({"type": "float", "value": 1.0}), its object kept in objs
   (shared with equal ones) under its row's index. */
static int value_row(Rows *r, PyObject *code, PyObject *leaf, PyObject *role) {
    PyObject *dtype = PyDict_GetItemWithError(leaf, s_dtype);
    if (dtype == NULL && (PyErr_Occurred() || (dtype = PyDict_GetItemWithError(leaf, s_type)) == NULL))
        return PyErr_Occurred() ? not_usual_or_error() : 0;
    Py_INCREF(dtype);
    PyObject *text = PyObject_Str(dtype), *cls = NULL;
    Py_DECREF(dtype);
    PyObject *grad = text ? PyDict_GetItemWithError(leaf, s_requires_grad) : NULL;
    PyObject *key = text == NULL || (grad == NULL && PyErr_Occurred())
                        ? NULL
                        : PyTuple_Pack(3, text, role, grad == Py_True ? Py_True : Py_False);
    Py_XDECREF(text);
    if (key != NULL) {
        cls = PyDict_GetItemWithError(r->value_classes, key);
        if (cls != NULL && cls != Py_None)
            Py_INCREF(cls);
        else if (!PyErr_Occurred()) /* a class not met before */
            cls = PyObject_CallOneArg(r->value_class, key);
        Py_DECREF(key);
    }
    if (cls == NULL)
        return not_usual_or_error();
    PyObject *kept = shared(r, leaf), *done = kept ? PyObject_GetAttr(r->builder, s_done) : NULL;
    PyObject *count = done ? PyLong_FromSsize_t(PyList_GET_SIZE(r->suffix)) : NULL;
    PyObject *row = count ? PyNumber_Add(done, count) : NULL;
    Py_ssize_t end = PyList_GET_SIZE(r->stats);
    int answer = row != NULL && PyObject_SetItem(r->objs, row, kept) == 0 && PyList_Append(r->suffix, code) == 0 &&
                         PyList_Append(r->row_class, cls) == 0 && PyList_SetSlice(r->stats, end, end, r->no_stats) == 0
                     ? 1
                     : not_usual_or_error();
    Py_XDECREF(row);
    Py_XDECREF(count);
    Py_XDECREF(done);
    Py_XDECREF(kept);
    Py_DECREF(cls);
    return answer;
}

/* One leaf of a part, named by suffix `code`: its row appended (1), or 0 when it is not a usual leaf. */
static int leaf_row(Rows *r, PyObject *code, PyObject *leaf, PyObject *role) {
    if (!PyDict_CheckExact(leaf))
        return 0;
    PyObject *type = PyDict_GetItemWithError(leaf, s_type);
    if (type == NULL || !PyUnicode_CheckExact(type))
        return type == NULL && PyErr_Occurred() ? not_usual_or_error() : 0;
    int has_dtype = PyDict_Contains(leaf, s_dtype), has_shape = PyDict_Contains(leaf, s_shape);
    if (has_dtype < 0 || has_shape < 0)
        return not_usual_or_error();
    if (has_dtype && has_shape)
        return tensor_row(r, code, leaf, role);
    if (has_shape)
        return 0;
    return value_row(r, code, leaf, role);
}

/* The rows of a part that is a list of leaves. `known`: the suffix codes of .{infix}.0, .{infix}.1, ...,
   grown here as _usual grows it. */
static int list_rows(Rows *r, PyObject *value, PyObject *infix, PyObject *role, PyObject *known) {
    Py_ssize_t have = PyList_GET_SIZE(known), n = PyList_GET_SIZE(value);
    if (have < n) {
        PyObject *more = PyList_New(0);
        if (more == NULL)
            return -1;
        for (Py_ssize_t i = have; i < n + 8; i++) {
            PyObject *code = suffix_code(r, PyUnicode_FromFormat(".%U.%zd", infix, i));
            int added = code != NULL && PyList_Append(more, code) == 0;
            Py_XDECREF(code);
            if (!added) {
                Py_DECREF(more);
                return not_usual_or_error();
            }
        }
        int grown = PyList_SetSlice(known, PyList_GET_SIZE(known), PyList_GET_SIZE(known), more);
        Py_DECREF(more);
        if (grown < 0)
            return -1;
    }
    /* zip(known, value): the sizes are read again at each step, as list iterators do */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(known) && i < PyList_GET_SIZE(value); i++) {
        PyObject *code = PyList_GET_ITEM(known, i), *leaf = PyList_GET_ITEM(value, i);
        Py_INCREF(code);
        Py_INCREF(leaf);
        int answer = leaf_row(r, code, leaf, role);
        Py_DECREF(code);
        Py_DECREF(leaf);
        if (answer != 1)
            return answer;
    }
    return 1;
}

/* The rows of a part that is an object: one leaf (`.output`), or leaves by key (`.input.alpha`), their codes
   all made before the first row, as _usual's list of pairs makes them. */
static int object_rows(Rows *r, PyObject *value, PyObject *infix, PyObject *role) {
    PyObject *type = PyDict_GetItemWithError(value, s_type);
    if (type != NULL && PyUnicode_CheckExact(type)) {
        PyObject *code = suffix_code(r, PyUnicode_FromFormat(".%U", infix));
        if (code == NULL)
            return not_usual_or_error();
        int answer = leaf_row(r, code, value, role);
        Py_DECREF(code);
        return answer;
    }
    if (type == NULL && PyErr_Occurred())
        return not_usual_or_error();
    int has_dtype = PyDict_Contains(value, s_dtype), has_shape = has_dtype ? 0 : PyDict_Contains(value, s_shape);
    if (has_dtype != 0 || has_shape != 0) /* record_rows says if it is a tensor without type */
        return has_dtype < 0 || has_shape < 0 ? not_usual_or_error() : 0;
    PyObject *items = PyDict_Items(value), *codes = items ? PyList_New(PyList_GET_SIZE(items)) : NULL;
    int answer = codes != NULL ? 1 : -1;
    for (Py_ssize_t i = 0; answer == 1 && i < PyList_GET_SIZE(codes); i++) {
        PyObject *text = PyObject_Format(PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 0), s_empty);
        PyObject *code = suffix_code(r, text ? PyUnicode_FromFormat(".%U.%U", infix, text) : NULL);
        Py_XDECREF(text);
        if (code == NULL)
            answer = not_usual_or_error();
        else
            PyList_SET_ITEM(codes, i, code);
    }
    for (Py_ssize_t i = 0; answer == 1 && i < PyList_GET_SIZE(codes); i++)
        answer = leaf_row(r, PyList_GET_ITEM(codes, i), PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 1), role);
    Py_XDECREF(items);
    Py_XDECREF(codes);
    return answer;
}

/* _usual(record, parts): 1 with the record's rows appended, 0 when it is not usual, -1 with an exception. */
static int record_rows(Rows *r, PyObject *record, PyObject *parts) {
    for (Py_ssize_t p = 0; p < PyTuple_GET_SIZE(parts); p++) {
        PyObject *part = PyTuple_GET_ITEM(parts, p);
        if (!PyTuple_CheckExact(part) || PyTuple_GET_SIZE(part) != 4 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(part, 1)) || !PyList_Check(PyTuple_GET_ITEM(part, 3))) {
            PyErr_SetString(PyExc_TypeError, "Rows: parts must be (key, infix, role, known codes) tuples");
            return -1;
        }
        PyObject *infix = PyTuple_GET_ITEM(part, 1), *role = PyTuple_GET_ITEM(part, 2);
        PyObject *value = PyObject_GetItem(record, PyTuple_GET_ITEM(part, 0));
        if (value == NULL)
            return not_usual_or_error();
        int answer = PyList_CheckExact(value)   ? list_rows(r, value, infix, role, PyTuple_GET_ITEM(part, 3))
                     : PyDict_CheckExact(value) ? object_rows(r, value, infix, role)
                                                : value == Py_None;
        Py_DECREF(value);
        if (answer != 1)
            return answer;
    }
    return 1;
}

static PyObject *Rows_call(Rows *r, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "Rows(record, parts): expected a record and a tuple of parts");
        return NULL;
    }
    if (r->suffix == NULL) /* cleared by the garbage collector: the record goes to record_rows */
        Py_RETURN_FALSE;
    int answer = record_rows(r, args[0], args[1]);
    if (answer < 0)
        return NULL;
    return PyBool_FromLong(answer);
}

/* fn(a long long) as a statement: 0, or -1 with an exception set. */
static int call_with_int(PyObject *fn, long long value) {
    PyObject *number = PyLong_FromLongLong(value), *result = number ? PyObject_CallOneArg(fn, number) : NULL;
    Py_XDECREF(number);
    Py_XDECREF(result);
    return result != NULL ? 0 : -1;
}

/* _Builder.add(name, record, at, length) of a record that is a dict and a name that is not empty: 0, or -1
   with an exception set (_Refused from its other_rows). */
static int add(Rows *r, PyObject *name, PyObject *record, long long at, long long length) {
    if (PyList_Append(r->names, name) < 0 || call_with_int(r->spans_append, at) < 0 ||
        call_with_int(r->spans_append, length) < 0)
        return -1;
    PyObject *keys = PySequence_Tuple(record);
    if (keys == NULL)
        return -1;
    PyObject *plan = kept_or_made(r->plans, keys, r->plan);
    Py_DECREF(keys);
    if (plan == NULL)
        return -1;
    if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 2 || !PyTuple_CheckExact(PyTuple_GET_ITEM(plan, 1))) {
        PyErr_SetString(PyExc_TypeError, "Rows.lines: a plan must be (bits, parts)");
        Py_DECREF(plan);
        return -1;
    }
    PyObject *bits = PyObject_CallOneArg(r->parts_append, PyTuple_GET_ITEM(plan, 0));
    Py_ssize_t start = PyList_GET_SIZE(r->suffix);
    int usual = bits == NULL                                         ? -1
                : PyTuple_GET_SIZE(PyTuple_GET_ITEM(plan, 1)) > 0 ? record_rows(r, record, PyTuple_GET_ITEM(plan, 1))
                                                                 : 0; /* not &&: that makes record_rows' -1 a 1 */
    Py_XDECREF(bits);
    Py_DECREF(plan);
    if (usual < 0)
        return -1;
    if (!usual) {
        PyObject *done = PyObject_CallFunction(r->other_rows, "OOn", name, record, start);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
    }
    if (PyList_GET_SIZE(r->suffix) >= r->batch) {
        PyObject *done = PyObject_CallNoArgs(r->flush);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
    }
    PyObject *done = PyObject_GetAttr(r->builder, s_done);
    long long rows = done ? PyLong_AsLongLong(done) : -1;
    Py_XDECREF(done);
    if (rows == -1 && PyErr_Occurred())
        return -1;
    return call_with_int(r->first_row_append, rows + PyList_GET_SIZE(r->suffix));
}

static int is_digit(char c) { return (unsigned char)(c - '0') < 10; }

/* Whether the 8 ASCII bytes at `p` are all digits: a byte's top bit set by adding 0x50 is 0x30 or more, by
   adding 0x46 0x3a or more (no carry across bytes below 0x80). */
static int eight_digits(const char *p) {
    uint64_t x, ones = 0x0101010101010101u;
    memcpy(&x, p, 8);
    return ((x + 0x50 * ones) & ~(x + 0x46 * ones) & 0x80 * ones) == 0x80 * ones;
}

/* Whether the digits p[first..last] are an integer: not a float's fraction, exponent or integer part. */
static int integer_digits(const char *p, Py_ssize_t n, Py_ssize_t first, Py_ssize_t last) {
    char before = first > 0 ? p[first - 1] : ' ', after = last + 1 < n ? p[last + 1] : ' ';
    int exponent = before == 'e' || before == 'E' ||
                   ((before == '-' || before == '+') && first > 1 && (p[first - 2] == 'e' || p[first - 2] == 'E'));
    return before != '.' && !exponent && after != '.' && after != 'e' && after != 'E';
}

/* Whether the ASCII text `p` (n bytes) holds an integer of 19 digits or more: perhaps beyond 64 bits, which
   orjson reads as a float and json exactly (_big_int). Its digits cover a whole one of the text's 8-byte
   blocks, and the first such block has 7 digits at most before it: only after those blocks is a run
   measured, then before them where it could be long enough. */
static int big_int(const char *p, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k + 8 <= n; k += 8) {
        if (!eight_digits(p + k))
            continue;
        Py_ssize_t last = k + 7, first = k;
        while (last + 1 < n && is_digit(p[last + 1]))
            last++;
        if (last - k + 1 + 7 >= 19) {
            while (first > 0 && is_digit(p[first - 1]))
                first--;
            if (last - first + 1 >= 19 && integer_digits(p, n, first, last))
                return 1;
        }
        k = last / 8 * 8; /* on from the block where the run ends */
    }
    return 0;
}

/* One line (`p`, n bytes with its end; at byte `offset` of the file) read as _Lines.line reads a record
   line, when it is a usual one: 1 with its record added and *comma set, 0 (nothing done) for any other line,
   -1 with an exception set. */
static int usual_line(Rows *r, const char *p, Py_ssize_t n, long long offset, int *comma, PyObject *loads) {
    if (n == 0 || p[0] != '"' || (PyList_GET_SIZE(r->names) > 0 && !*comma))
        return 0;
    unsigned char high = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        high |= (unsigned char)p[i];
    if (high & 0x80 || big_int(p, n)) /* big_int after: it reads ASCII */
        return 0;
    Py_ssize_t end = n;
    while (end > 0 && (p[end - 1] == '\r' || p[end - 1] == '\n'))
        end--;
    int ends_with_comma = end > 0 && p[end - 1] == ',';
    end -= ends_with_comma;
    Py_ssize_t quote = 1; /* the name: a string of one character or more, with no escape or control character */
    while (quote < n && p[quote] != '"' && p[quote] != '\\' && (unsigned char)p[quote] >= 0x20)
        quote++;
    if (quote == 1 || quote + 3 > n || p[quote] != '"' || p[quote + 1] != ':' || p[quote + 2] != ' ')
        return 0;
    Py_ssize_t start = quote + 3;
    if (start >= end)
        return 0;
    PyObject *text = PyBytes_FromStringAndSize(p + start, end - start);
    PyObject *record = text ? PyObject_CallOneArg(loads, text) : NULL;
    Py_XDECREF(text);
    if (record == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) /* NaN or Infinity: json reads it, in _Lines.line */
            return -1;
        PyErr_Clear();
        return 0;
    }
    int answer = 0;
    if (PyDict_CheckExact(record)) { /* anything else is refused, by _Builder.add */
        PyObject *name = PyUnicode_DecodeASCII(p + 1, quote - 1, NULL);
        answer = name != NULL && add(r, name, record, offset + start, end - start) == 0 ? 1 : -1;
        Py_XDECREF(name);
    }
    Py_DECREF(record);
    if (answer == 1)
        *comma = ends_with_comma;
    return answer;
}

/* The reader's offset, comma and closed (0, or -1 with an exception set). */
static int reader_state(PyObject *reader, long long *offset, int *comma, int *closed) {
    PyObject *values[3] = {PyObject_GetAttr(reader, s_offset), PyObject_GetAttr(reader, s_comma),
                           PyObject_GetAttr(reader, s_closed)};
    int ok = values[0] && values[1] && values[2];
    if (ok) {
        *offset = PyLong_AsLongLong(values[0]);
        *comma = PyObject_IsTrue(values[1]);
        *closed = PyObject_IsTrue(values[2]);
        ok = !PyErr_Occurred() && *comma >= 0 && *closed >= 0;
    }
    for (int i = 0; i < 3; i++)
        Py_XDECREF(values[i]);
    return ok ? 0 : -1;
}

static int set_reader_state(PyObject *reader, long long offset, int comma) {
    PyObject *number = PyLong_FromLongLong(offset);
    int ok = number != NULL && PyObject_SetAttr(reader, s_offset, number) == 0 &&
             PyObject_SetAttr(reader, s_comma, comma ? Py_True : Py_False) == 0;
    Py_XDECREF(number);
    return ok ? 0 : -1;
}

/* Rows.lines(chunk, reader): each line of `chunk` (bytes of whole lines) read as reader.line(line) would read
   it, in order; False as soon as reader.line answers False. */
static PyObject *Rows_lines(Rows *r, PyObject *args) {
    PyObject *chunk, *reader;
    if (!PyArg_ParseTuple(args, "O!O:lines", &PyBytes_Type, &chunk, &reader))
        return NULL;
    PyObject *loads = PyObject_GetAttr(reader, s_fast_loads), *line = loads ? PyObject_GetAttr(reader, s_line) : NULL;
    long long offset;
    int comma, closed, ok = 1;
    if (line == NULL || reader_state(reader, &offset, &comma, &closed) < 0)
        goto error;
    const char *p = PyBytes_AS_STRING(chunk); /* the arguments' tuple holds chunk while reader.line runs */
    Py_ssize_t size = PyBytes_GET_SIZE(chunk);
    for (Py_ssize_t at = 0; at < size && ok;) {
        const char *newline = memchr(p + at, '\n', size - at);
        Py_ssize_t n = newline ? newline - (p + at) + 1 : size - at;
        /* r->suffix is NULL once the garbage collector cleared this object: the builder's Python reads on */
        int done = closed || r->suffix == NULL || loads == Py_None ? 0 : usual_line(r, p + at, n, offset, &comma, loads);
        if (done < 0)
            goto error;
        if (done) {
            offset += n;
        } else {
            PyObject *piece = set_reader_state(reader, offset, comma) == 0 ? PyBytes_FromStringAndSize(p + at, n) : NULL;
            PyObject *answer = piece ? PyObject_CallOneArg(line, piece) : NULL;
            Py_XDECREF(piece);
            ok = answer ? PyObject_IsTrue(answer) : -1;
            Py_XDECREF(answer);
            if (ok < 0 || reader_state(reader, &offset, &comma, &closed) < 0)
                goto error;
        }
        at += n;
    }
    if (set_reader_state(reader, offset, comma) < 0)
        goto error;
    Py_DECREF(loads);
    Py_DECREF(line);
    return PyBool_FromLong(ok);
error:
    Py_XDECREF(loads);
    Py_XDECREF(line);
    return NULL;
}

static PyMethodDef Rows_methods[] = {
    {"lines", (PyCFunction)Rows_lines, METH_VARARGS,
     "lines(chunk, reader) -> bool: compare.table._Lines.line of the reader for each line of chunk (bytes of whole "
     "lines); False where it answers False."},
    {NULL, NULL, 0, NULL},
};

/* builder.<name>, checked to be of `type` (a new reference), or NULL with an exception set. */
static PyObject *attribute(PyObject *builder, const char *name, PyTypeObject *type) {
    PyObject *value = PyObject_GetAttrString(builder, name);
    if (value == NULL)
        return NULL;
    if (type != NULL ? Py_TYPE(value) != type : !PyCallable_Check(value)) {
        PyErr_Format(PyExc_TypeError, "Rows(): the builder's %s is a %.100s, expected a %s", name,
                     Py_TYPE(value)->tp_name, type != NULL ? type->tp_name : "callable");
        Py_CLEAR(value);
    }
    return value;
}

/* builder.<name>.append (a new reference), or NULL with an exception set. */
static PyObject *append_of(PyObject *builder, const char *name) {
    PyObject *container = PyObject_GetAttrString(builder, name);
    PyObject *append = container ? PyObject_GetAttrString(container, "append") : NULL;
    Py_XDECREF(container);
    return append;
}

static PyObject *Rows_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *builder, *plain_name, *no_stats;
    Py_ssize_t batch;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Rows() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOO!n:Rows", &builder, &plain_name, &PyTuple_Type, &no_stats, &batch))
        return NULL;
    if (!PyCallable_Check(plain_name)) {
        PyErr_SetString(PyExc_TypeError, "Rows(): plain_name must be callable");
        return NULL;
    }
    Rows *r = (Rows *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->vectorcall = (vectorcallfunc)Rows_call;
    r->batch = batch;
    Py_INCREF(builder);
    r->builder = builder;
    Py_INCREF(plain_name);
    r->plain_name = plain_name;
    Py_INCREF(no_stats);
    r->no_stats = no_stats;
    if ((r->suffix = attribute(builder, "suffix", &PyList_Type)) == NULL ||
        (r->row_class = attribute(builder, "row_class", &PyList_Type)) == NULL ||
        (r->stats = attribute(builder, "stats", &PyList_Type)) == NULL ||
        (r->tensor_classes = attribute(builder, "tensor_classes", &PyDict_Type)) == NULL ||
        (r->suffix_codes = attribute(builder, "suffix_codes", &PyDict_Type)) == NULL ||
        (r->value_classes = attribute(builder, "value_classes", &PyDict_Type)) == NULL ||
        (r->objs = attribute(builder, "objs", &PyDict_Type)) == NULL ||
        (r->values = attribute(builder, "values", &PyDict_Type)) == NULL ||
        (r->new_suffix = attribute(builder, "_suffix", NULL)) == NULL ||
        (r->value_class = attribute(builder, "_value_class", NULL)) == NULL ||
        (r->tensor_class = attribute(builder, "_tensor_class", NULL)) == NULL ||
        (r->names = attribute(builder, "names", &PyList_Type)) == NULL ||
        (r->plans = attribute(builder, "plans", &PyDict_Type)) == NULL ||
        (r->spans_append = append_of(builder, "spans")) == NULL ||
        (r->parts_append = append_of(builder, "parts")) == NULL ||
        (r->first_row_append = append_of(builder, "first_row")) == NULL ||
        (r->plan = attribute(builder, "_plan", NULL)) == NULL ||
        (r->other_rows = attribute(builder, "_other_rows", NULL)) == NULL ||
        (r->flush = attribute(builder, "_flush", NULL)) == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

GC_FIELD_FUNCTIONS(Rows, Rows_traverse, Rows_clear, ROWS_FIELDS)

static void Rows_dealloc(Rows *r) {
    PyObject_GC_UnTrack(r);
    Rows_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyTypeObject RowsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "msprobe_lite.compare._fast_table.Rows",
    .tp_basicsize = sizeof(Rows),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Rows(builder, plain_file_name, no_stats, batch)(record, parts) -> bool: compare.table._Builder._usual "
              "of that builder, whose lists, dicts and arrays it keeps (they are never replaced); no_stats: the tuple "
              "a value's row adds to stats; batch: the rows after which the builder's _flush is called.",
    .tp_methods = Rows_methods,
    .tp_new = Rows_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Rows, vectorcall),
    .tp_traverse = (traverseproc)Rows_traverse,
    .tp_clear = (inquiry)Rows_clear,
    .tp_dealloc = (destructor)Rows_dealloc,
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fast_table",
                                    "The usual record's rows and lines of compare/table.py in C.", -1, NULL};

PyMODINIT_FUNC PyInit__fast_table(void) {
    INTERN(s_type, "type")
    INTERN(s_dtype, "dtype")
    INTERN(s_shape, "shape")
    INTERN(s_md5, "md5")
    INTERN(s_data_name, "data_name")
    INTERN(s_requires_grad, "requires_grad")
    INTERN(s_empty, "")
    INTERN(s_hex, "hex")
    INTERN(s_done, "done")
    INTERN(s_offset, "offset")
    INTERN(s_comma, "comma")
    INTERN(s_closed, "closed")
    INTERN(s_line, "line")
    INTERN(s_fast_loads, "fast_loads")
    INTERN(s_stats[0], "Max")
    INTERN(s_stats[1], "Min")
    INTERN(s_stats[2], "Mean")
    INTERN(s_stats[3], "Norm")
    PyObject *builtins = PyImport_ImportModule("builtins");
    if (builtins == NULL)
        return NULL;
    builtin_sum = PyObject_GetAttrString(builtins, "sum");
    Py_DECREF(builtins);
    if (builtin_sum == NULL)
        return NULL;
    return module_with_type(&MODULE, "Rows", &RowsType);
}
