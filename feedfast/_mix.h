/* feedfast/_mix.c: a batch's mixup and cutmix in place (feedfast._native.mix_into). */
#ifndef FEEDFAST_MIX_H
#define FEEDFAST_MIX_H

#include <Python.h>

PyObject *mix_into(PyObject *self, PyObject *args);

#endif
