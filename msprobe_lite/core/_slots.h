/* Instances of the debugger's plain __slots__ classes made and read from C through their slot descriptors.

Why: the C routes make a record (core/records.py Record) for every captured call and a summary
(TensorSummary) for every new tensor value, a few hundred each per training step. Calling the class runs
its __init__ as a Python frame, most of the cost of making one. Those __init__ methods only store their
arguments in the slots, so the same object is made by allocating the instance and setting each slot through
its descriptor, the descriptor protocol's own public entry points (tp_descr_get / tp_descr_set of the member
descriptor type): no name lookup, no knowledge of where a slot lives in the object.

slots_find() checks once that the class is such a class: derived from object alone, with object's own
__new__, no __dict__, no weak references, no slots but the named ones (its size says so), and every name a
member descriptor of the class itself; if not (a subclass, a slot added), it returns 0 and the caller keeps
calling the class. A change to one of those __init__ methods beyond storing its arguments must come here too
(the tests compare both routes byte for byte).
*/
#ifndef MSPROBE_LITE_SLOTS_H
#define MSPROBE_LITE_SLOTS_H

#include <Python.h>

#define SLOTS_MAX 8

typedef struct {
    PyTypeObject *type; /* borrowed: the caller keeps the class alive; NULL: not usable */
    int n;
    PyObject *descr[SLOTS_MAX]; /* held */
} slots_t;

/* Lets go of the descriptors; `s` is then unusable (type NULL) until slots_find() again. */
static inline void slots_clear(slots_t *s) {
    for (int i = 0; s->type != NULL && i < s->n; i++)
        Py_CLEAR(s->descr[i]);
    s->type = NULL;
    s->n = 0;
}

/* 1: `s` makes instances of `cls` with `names` filled; 0: it cannot (use the class); -1 with an error set. `s`
   is zeroed or was filled by slots_find() before. */
static inline int slots_find(slots_t *s, PyObject *cls, const char *const *names, int n) {
    slots_clear(s);
    if (!PyType_Check(cls) || n > SLOTS_MAX)
        return 0;
    PyTypeObject *type = (PyTypeObject *)cls;
    if (type->tp_base != &PyBaseObject_Type || type->tp_new != PyBaseObject_Type.tp_new || type->tp_dictoffset != 0 ||
        type->tp_itemsize != 0 || type->tp_weaklistoffset != 0 ||
        type->tp_basicsize != PyBaseObject_Type.tp_basicsize + n * (Py_ssize_t)sizeof(PyObject *))
        return 0;
    PyObject *descr[SLOTS_MAX];
    int found = 0, usable = 1;
    for (; usable && found < n; found++) {
        PyObject *d = descr[found] = PyObject_GetAttrString(cls, names[found]);
        if (d == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                break;
            PyErr_Clear();
            usable = 0;
            break;
        }
        /* a slot of this class itself (a class attribute may be another class's descriptor) */
        PyObject *owner = Py_IS_TYPE(d, &PyMemberDescr_Type) ? PyObject_GetAttrString(d, "__objclass__") : NULL;
        if (owner == NULL && PyErr_Occurred())
            PyErr_Clear();
        usable = owner == cls;
        Py_XDECREF(owner);
        for (int j = 0; usable && j < found; j++)
            usable = descr[j] != d; /* a name listed twice would leave a slot unset */
    }
    if (usable && found == n) {
        for (int i = 0; i < n; i++)
            s->descr[i] = descr[i];
        s->type = type;
        s->n = n;
        return 1;
    }
    int failed = PyErr_Occurred() != NULL;
    for (int i = 0; i < found; i++)
        Py_XDECREF(descr[i]);
    return failed ? -1 : 0;
}

/* obj.<names[i]> of an instance of exactly s->type, as a new reference; NULL: an error is set, or none when the
   slot is unset. */
static inline PyObject *slots_get(const slots_t *s, PyObject *obj, int i) {
    PyObject *v = PyMemberDescr_Type.tp_descr_get(s->descr[i], obj, (PyObject *)s->type);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_AttributeError))
        PyErr_Clear();
    return v;
}

/* obj.<names[i]> = value (not stolen): 0, or -1 with an error set. */
static inline int slots_set(const slots_t *s, PyObject *obj, int i, PyObject *value) {
    return PyMemberDescr_Type.tp_descr_set(s->descr[i], obj, value);
}

/* A new instance with its slots set to `values` (n of them, in slots_find's order; not stolen). */
static inline PyObject *slots_new(const slots_t *s, PyObject *const *values) {
    PyObject *obj = s->type->tp_alloc(s->type, 0);
    for (int i = 0; obj != NULL && i < s->n; i++)
        if (slots_set(s, obj, i, values[i]) < 0)
            Py_CLEAR(obj);
    return obj;
}

#endif
