"""An Arrow string or binary array's offsets and bytes as numpy arrays, for the kernels that work on the
bytes of many values at once (murmur3, the key column's NUL check, fixed-width key layouts)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa


def string_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data): the `len(array) + 1` offsets of its values (32- or 64-bit in Arrow, int64 here) and
    the data buffer they index, a view. A slice's offsets start where its first value does, not at 0."""
    t = array.type
    width = np.dtype(np.int64 if pa.types.is_large_string(t) or pa.types.is_large_binary(t) else np.int32)
    _, offsets_buffer, data_buffer = array.buffers()
    if offsets_buffer is None:  # an empty array may have none
        return np.zeros(1, np.int64), np.zeros(0, np.uint8)
    offsets = np.frombuffer(offsets_buffer, width, len(array) + 1, array.offset * width.itemsize).astype(np.int64)
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return offsets, data
