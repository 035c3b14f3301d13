"""Types of the compiled runner (``_numpy_loops.pyx``; see ``_numpy_fuse.py``)."""

from typing import Any

import numpy as np

def run(
    code: np.ndarray[Any, np.dtype[np.int64]],
    arrays: list[Any],
    modes: np.ndarray[Any, np.dtype[np.int64]],
    lo: int,
    n: int,
    block: int,
) -> int: ...
