"""The tensor-aware pickler of ftrun.state_pack: a tensor it meets goes to
the packer's buffers and is pickled as its persistent id (a DTensor or
ShardedTensor through ftrun.sharded). It pickles a skeleton's objects
(format 2) and, for a structure that is not a tree, the whole structure
(format 1, whose tensors walk names by their path first).
"""

import pickle

import torch

from . import sharded as _sharded
from . import state_flat

PICKLE_PROTOCOL = 4
_CONTAINERS = (torch.Tensor, dict, list, tuple)


def walk(obj, path, names, seen):
    """Records id(tensor) -> path for tensors reachable through dicts, lists
    and tuples (the first path wins when a tensor is reached twice)."""
    if isinstance(obj, torch.Tensor):
        names.setdefault(id(obj), path)
        return
    if isinstance(obj, (dict, list, tuple)):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        # Only what can hold a tensor is visited (a random.getstate() alone
        # is a tuple of 625 ints).
        if isinstance(obj, dict):
            for k, v in obj.items():
                if isinstance(v, _CONTAINERS):
                    walk(v, state_flat.join(path, state_flat.escape(k)), names, seen)
        else:
            fields = getattr(obj, "_fields", None) if isinstance(obj, tuple) else None
            for i, v in enumerate(obj):
                if isinstance(v, _CONTAINERS):
                    seg = state_flat.escape(fields[i]) if fields and i < len(fields) else str(i)
                    walk(v, state_flat.join(path, seg), names, seen)


def storable(t):
    """Dense tensors of plain Tensor/Parameter types go to the store; sparse,
    quantized, nested, meta and tensor subclasses are pickled as torch does."""
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        return False
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        return False
    if getattr(t, "is_nested", False):
        return False
    return True


class Pickler(pickle.Pickler):
    def __init__(self, file, packer, names, prefix):
        super().__init__(file, protocol=PICKLE_PROTOCOL)
        self._packer = packer
        self._names = names
        self._prefix = prefix

    def persistent_id(self, obj):
        if not isinstance(obj, torch.Tensor):  # called for every object the skeleton holds
            return None
        # ftrun.sharded hook: a DTensor / ShardedTensor saves its local shard(s) only.
        if type(obj) is not torch.Tensor:
            pid = _sharded.persistent_id(obj, self._packer, self._names, self._prefix)
            if pid is not None:
                return pid
        if storable(obj):
            return ("ftrun.tensor", self._packer.add(obj, self._names, self._prefix))
        return None
