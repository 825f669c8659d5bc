/* The usual record's rows of compare/table.py (_Builder._usual), in C.

Why C: a large dump has hundreds of thousands of leaves, and in Python each is a dozen dict probes, type
tests, a key tuple and six appends. Here a usual leaf (a tensor of a class met before with four float
statistics and no md5, or a value of a class met before) costs no Python call; what is met for the first
time (a suffix, a tensor or value class) calls back into the builder's own methods, so the rules for it stay
written once, in Python.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "_module.h"

static PyObject *s_type, *s_dtype, *s_shape, *s_md5, *s_data_name, *s_requires_grad, *s_empty, *s_stats[4];
static PyObject *s_hex, *s_done;
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
        X(values) X(new_suffix) X(value_class) X(tensor_class) X(plain_name) X(no_stats)

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *builder;                    /* read for its `done` only: the rest is kept here */
    PyObject *suffix, *row_class, *stats; /* its row lists, appended to in place */
    PyObject *tensor_classes, *suffix_codes, *value_classes, *objs, *values;
    PyObject *new_suffix, *value_class, *tensor_class; /* its methods for what is new */
    PyObject *plain_name;                              /* rows.plain_file_name */
    PyObject *no_stats;                                /* the tuple a row without statistics adds to stats */
} Rows;

/* The suffix code of `text` (a new reference): the builder's dict holds it, or its _suffix makes it. */
static PyObject *suffix_code(Rows *r, PyObject *text) {
    if (text == NULL)
        return NULL;
    PyObject *code = PyDict_GetItemWithError(r->suffix_codes, text);
    if (code != NULL)
        Py_INCREF(code);
    else if (!PyErr_Occurred())
        code = PyObject_CallOneArg(r->new_suffix, text);
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

static PyObject *Rows_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *builder, *plain_name, *no_stats;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Rows() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOO!:Rows", &builder, &plain_name, &PyTuple_Type, &no_stats))
        return NULL;
    if (!PyCallable_Check(plain_name)) {
        PyErr_SetString(PyExc_TypeError, "Rows(): plain_name must be callable");
        return NULL;
    }
    Rows *r = (Rows *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->vectorcall = (vectorcallfunc)Rows_call;
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
        (r->tensor_class = attribute(builder, "_tensor_class", NULL)) == NULL) {
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
    .tp_doc = "Rows(builder, plain_file_name, no_stats)(record, parts) -> bool: compare.table._Builder._usual "
              "of that builder, whose lists and dicts it keeps (they are never replaced); no_stats: the tuple a "
              "value's row adds to stats.",
    .tp_new = Rows_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Rows, vectorcall),
    .tp_traverse = (traverseproc)Rows_traverse,
    .tp_clear = (inquiry)Rows_clear,
    .tp_dealloc = (destructor)Rows_dealloc,
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fast_table",
                                    "The usual record's rows of compare/table.py in C.", -1, NULL};

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
