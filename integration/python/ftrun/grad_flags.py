"""A restored tensor's autograd flags, as its metadata recorded them at
save time: shared by the plain unpacking (state_unpack) and the sharded
tensors' (sharded), which each rebuild tensors from the same metadata."""
import torch


def with_grad_flags(t, info):
    """t as it was saved: an nn.Parameter and/or requiring grad, as the
    metadata says (only floating and complex tensors can require grad)."""
    rg = info["requires_grad"] and (t.is_floating_point() or t.is_complex())
    if info.get("param"):
        return torch.nn.Parameter(t, requires_grad=rg)
    if rg:
        t.requires_grad_(True)
    return t
