/* A C extension's module with its one public type, for the extensions that define a type. */
#ifndef MSPROBE_LITE_MODULE_H
#define MSPROBE_LITE_MODULE_H

#include <Python.h>

/* PyModule_Create(def) with `type` (readied here) added as `name`: the module, or NULL with an exception set. */
static inline PyObject *module_with_type(PyModuleDef *def, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0)
        return NULL;
    PyObject *module = PyModule_Create(def);
    if (module == NULL)
        return NULL;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

#endif
