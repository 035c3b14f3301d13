# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled half of ``_numpy_fuse.py``: a fused chain's program run on one chunk, block by
block, each step one call of NumPy's own inner loop, with the GIL released for the whole
chunk. Compiled in the wheel only (``setup.py``); without it the chain's blocks are NumPy
calls (``_chain.py``)."""

from cpython.buffer cimport PyBUF_STRIDES, PyBuffer_Release, PyObject_GetBuffer
from cpython.exc cimport PyErr_Clear, PyErr_Occurred
from libc.stdint cimport int64_t

cdef extern from "fenv.h" nogil:
    int FE_DIVBYZERO
    int FE_OVERFLOW
    int FE_UNDERFLOW
    int FE_INVALID
    int feclearexcept(int excepts)
    int fetestexcept(int excepts)

# NumPy's PyUFuncGenericFunction (npy_intp is Py_ssize_t on every platform NumPy supports).
ctypedef void (*loop_t)(char **args, Py_ssize_t *dims, Py_ssize_t *steps, void *data) noexcept nogil

cdef enum:
    # The most operands of one step (inputs and the output): ``_numpy_fuse.py`` admits ufuncs of
    # one or two inputs and one output.
    MAX_ARGS = 4
    # The most arrays of one program: its inputs, live results, scratch blocks and constants
    # (a program has at most 64 steps: ``_chain.FUSE_STEPS``).
    MAX_SLOTS = 512


def run(
    const int64_t[::1] code,
    list arrays,
    const int64_t[::1] modes,
    Py_ssize_t lo,
    Py_ssize_t n,
    Py_ssize_t block,
):
    """Run ``code`` over elements ``lo`` to ``lo + n`` of the arrays, ``block`` at a time;
    return the floating-point errors the loops raised: a mask of 1 (divide by zero),
    2 (overflow), 4 (underflow) and 8 (invalid), as NumPy's ``errstate`` names them; -1 if
    a loop set a Python exception (cleared: the caller evaluates the chunk again with NumPy
    calls, which raise it).

    ``code``, per step: the loop's address, its ``data``, the number of operands ``k``
    (inputs, then the output), and ``k`` slot numbers. ``arrays``, per slot: a contiguous,
    aligned 1-D array (any object with the buffer protocol: the loops are called with its
    stride, as NumPy calls them on such arrays); ``modes``, per slot: 2 if it moves with the block
    (an input or a result, from element ``lo``), 1 if every block reuses its start (a scratch
    block), 0 if its element 0 is every element (a constant), 3 if each block has an element of
    its own, read and written as every element (a reduction's partials: block ``i`` of the run
    accumulates into element ``i``, as NumPy's reduce calls a loop, with the output the first
    input and both of stride 0). The caller keeps every array in bounds (``_numpy_fuse.py``)."""
    cdef Py_ssize_t nslots = len(arrays)
    if modes.shape[0] != nslots or nslots > MAX_SLOTS:
        raise ValueError("one mode per array, at most MAX_SLOTS arrays")
    cdef char *bases[MAX_SLOTS]
    cdef Py_ssize_t steps_of[MAX_SLOTS]
    cdef int64_t moves[MAX_SLOTS]
    cdef Py_ssize_t per_block[MAX_SLOTS]
    cdef Py_buffer view
    cdef Py_ssize_t i
    for i in range(nslots):
        PyObject_GetBuffer(arrays[i], &view, PyBUF_STRIDES)
        try:
            if view.ndim != 1:
                raise ValueError("the arrays of a program are 1-D")
            steps_of[i] = view.strides[0] if modes[i] == 1 or modes[i] == 2 else 0
            moves[i] = modes[i] == 2
            per_block[i] = view.strides[0] if modes[i] == 3 else 0
            bases[i] = <char *>view.buf + (lo * view.strides[0] if moves[i] else 0)
        finally:
            PyBuffer_Release(&view)
    cdef char *args[MAX_ARGS]
    cdef Py_ssize_t strides[MAX_ARGS]
    cdef Py_ssize_t start = 0, m, pos, k, nargs, slot, ncode = code.shape[0], blockno = 0
    cdef loop_t loop
    cdef void *data
    cdef int raised = 0
    with nogil:
        feclearexcept(FE_DIVBYZERO | FE_OVERFLOW | FE_UNDERFLOW | FE_INVALID)
        while start < n:
            m = n - start
            if m > block:
                m = block
            pos = 0
            while pos < ncode:
                loop = <loop_t><Py_ssize_t>code[pos]
                data = <void *><Py_ssize_t>code[pos + 1]
                nargs = <Py_ssize_t>code[pos + 2]
                pos += 3
                for k in range(nargs):
                    slot = <Py_ssize_t>code[pos + k]
                    strides[k] = steps_of[slot]
                    args[k] = bases[slot]
                    if moves[slot]:
                        args[k] += start * strides[k]
                    else:
                        args[k] += blockno * per_block[slot]
                pos += nargs
                loop(args, &m, strides, data)
                # After each call: a loop may clear the flags as it starts (NumPy's SIMD
                # loops do, to drop the ones their own comparisons raise).
                raised |= fetestexcept(FE_DIVBYZERO | FE_OVERFLOW | FE_UNDERFLOW | FE_INVALID)
            start += m
            blockno += 1
    if PyErr_Occurred() != NULL:
        PyErr_Clear()
        return -1
    return (
        (1 if raised & FE_DIVBYZERO else 0)
        | (2 if raised & FE_OVERFLOW else 0)
        | (4 if raised & FE_UNDERFLOW else 0)
        | (8 if raised & FE_INVALID else 0)
    )
