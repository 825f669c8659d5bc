/* Instances of the debugger's plain __slots__ classes made from C without running their Python __init__.

Why: the C routes make a record (core/records.py Record) for every captured call and a summary
(TensorSummary) for every new tensor value, a few hundred each per training step. Calling the class runs
its __init__ as a Python frame, about 0.35 µs, most of the cost of making one. Those __init__ methods only
store their arguments in the slots, so the same object is made by allocating the instance and filling the
slots here, in the order the class lists them.

slots_find() checks once that the class is such a class: derived from object alone, with object's own
__new__, no __dict__, no slots but the named ones (its size says so), and every name a slot of an object
reference; if not (a subclass, a slot added), it returns 0 and the caller keeps calling the class. A change to one of those __init__ methods beyond storing its arguments must come here too (the
tests compare both routes byte for byte).
*/
#ifndef MSPROBE_LITE_SLOTS_H
#define MSPROBE_LITE_SLOTS_H

#include <Python.h>
#include <structmember.h>

#define SLOTS_MAX 8

typedef struct {
    PyTypeObject *type; /* borrowed: the caller keeps the class alive */
    int n;
    Py_ssize_t offsets[SLOTS_MAX];
} slots_t;

/* 1: `s` makes instances of `cls` with `names` filled; 0: it cannot (use the class); -1 with an error set. */
static inline int slots_find(slots_t *s, PyObject *cls, const char *const *names, int n) {
    s->type = NULL;
    if (!PyType_Check(cls) || n > SLOTS_MAX)
        return 0;
    PyTypeObject *type = (PyTypeObject *)cls;
    if (type->tp_base != &PyBaseObject_Type || type->tp_new != PyBaseObject_Type.tp_new || type->tp_dictoffset != 0 || type->tp_itemsize != 0 ||
        type->tp_weaklistoffset != 0 ||
        type->tp_basicsize != PyBaseObject_Type.tp_basicsize + n * (Py_ssize_t)sizeof(PyObject *))
        return 0;
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString(cls, names[i]);
        if (d == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return -1;
            PyErr_Clear();
            return 0;
        }
        /* a slot of this class itself (a class attribute may be another class's descriptor), inside its size */
        int usable = Py_IS_TYPE(d, &PyMemberDescr_Type) && PyDescr_TYPE(d) == type &&
                     ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                     !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
        Py_ssize_t offset = usable ? ((PyMemberDescrObject *)d)->d_member->offset : 0;
        usable = usable && offset >= PyBaseObject_Type.tp_basicsize &&
                 offset + (Py_ssize_t)sizeof(PyObject *) <= type->tp_basicsize;
        s->offsets[i] = offset;
        Py_DECREF(d);
        for (int j = 0; usable && j < i; j++)
            usable = s->offsets[j] != s->offsets[i]; /* a name listed twice would leave a slot unset */
        if (!usable)
            return 0;
    }
    s->type = type;
    s->n = n;
    return 1;
}

/* A new instance with its slots set to `values` (n of them, in slots_find's order; new references taken). */
static inline PyObject *slots_new(const slots_t *s, PyObject *const *values) {
    PyObject *obj = s->type->tp_alloc(s->type, 0);
    if (obj == NULL)
        return NULL;
    for (int i = 0; i < s->n; i++) {
        Py_INCREF(values[i]);
        *(PyObject **)((char *)obj + s->offsets[i]) = values[i];
    }
    return obj;
}

#endif
