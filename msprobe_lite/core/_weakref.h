/* Whether a weak reference still points at an object, for every Python the C routes build for:
   PyWeakref_GetObject (a borrowed reference) is deprecated from 3.13, where PyWeakref_GetRef replaces it. */
#ifndef MSPROBE_LITE_WEAKREF_H
#define MSPROBE_LITE_WEAKREF_H

#include <Python.h>

/* 1 when weak reference `ref` points at `t` (alive: the caller holds it), 0 otherwise (not a weak reference,
   or dead). */
static inline int referent_is(PyObject *ref, PyObject *t) {
    if (!PyWeakref_Check(ref))
        return 0;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target = NULL;
    if (PyWeakref_GetRef(ref, &target) < 0)
        PyErr_Clear();
    Py_XDECREF(target); /* only compared: `t` is alive, so a match stays valid */
    return target == t;
#else
    return PyWeakref_GetObject(ref) == t;
#endif
}

#endif
