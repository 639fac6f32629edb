"""A tensor's bytes as the binding reads them (ftrun.state_pack): lazy
conjugate and negative bits resolved, CUDA memory described once, and
dtypes numpy lacks as raw bytes.
"""

import numpy as np
import torch

LAZY_BITS = hasattr(torch.Tensor, "is_conj") and hasattr(torch.Tensor, "is_neg")  # torch >= 1.10


def resolve(t):
    """Materializes lazy conjugate/negative bits (torch >= 1.10) so the bytes are plain."""
    if LAZY_BITS:
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
    return t


class CudaBytes:
    """A contiguous CUDA tensor's bytes as the binding reads them (uint8, the
    last dimension times the element size, as byte_view's view), described
    once here: torch computes __cuda_array_interface__ in Python on every
    read, and a view is a dispatched op - per tensor, per save. Holds the
    tensor, which the save's copies read until they are fenced."""

    __slots__ = ("__cuda_array_interface__", "tensor")

    def __init__(self, t):
        shape = tuple(t.shape) or (1,)
        size = t.element_size()
        if size != 1:
            shape = shape[:-1] + (shape[-1] * size,)
        self.tensor = t
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "|u1", "data": (t.data_ptr(), False),
                                         "version": 2}


def byte_view(t):
    """A uint8 view of a contiguous tensor's bytes, on its device, shaped so
    that the binding's dtype override gives back t's shape (the last
    dimension times the element size; 0-dim tensors as one element)."""
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dtype == torch.uint8:
        return t
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(torch.uint8)


def raw_bytes(t):
    flat = t.reshape(-1)
    try:
        return flat.view(torch.uint8).numpy()
    except (RuntimeError, TypeError):
        return flat.numpy().view(np.uint8)
