/* torch._C.DisableTorchFunction ("quiet") entered and left from C: the debugger's own reads of tensors must
   not reach a torch-function mode or tensor subclass of the user's. Shared by the API handler and the value
   encoder (pytorch/_fast_capture.c, pytorch/_fast_encode.c).

quiet_enter(cls) returns a new instance of `cls`, entered (NULL on failure); quiet_exit() leaves it, keeps
an exception already set (-1 then) and releases it. A new one each time: the object keeps the state it
replaced, so it must never be entered twice at once. */
#ifndef MSPROBE_LITE_QUIET_H
#define MSPROBE_LITE_QUIET_H

#include <Python.h>

static PyObject *QUIET_ENTER, *QUIET_EXIT; /* interned on first use */

static inline PyObject *quiet_enter(PyObject *cls) {
    if (QUIET_ENTER == NULL && (QUIET_ENTER = PyUnicode_InternFromString("__enter__")) == NULL)
        return NULL;
    PyObject *quiet = PyObject_CallNoArgs(cls);
    PyObject *entered = quiet ? PyObject_CallMethodNoArgs(quiet, QUIET_ENTER) : NULL;
    if (entered == NULL) {
        Py_XDECREF(quiet);
        return NULL;
    }
    Py_DECREF(entered);
    return quiet;
}

static inline int quiet_exit(PyObject *quiet) {
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    if (QUIET_EXIT == NULL)
        QUIET_EXIT = PyUnicode_InternFromString("__exit__");
    PyObject *args[] = {quiet, Py_None, Py_None, Py_None};
    PyObject *left = QUIET_EXIT ? PyObject_VectorcallMethod(QUIET_EXIT, args, 4, NULL) : NULL; /* args[0]: self */
    Py_DECREF(quiet);
    if (left == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
        return -1;
    }
    Py_DECREF(left);
    PyErr_Restore(type, exc, tb);
    return type == NULL ? 0 : -1;
}

#endif
