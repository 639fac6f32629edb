"""Sharded tensors (torch 2.x) through ftrun.save / ftrun.load: each rank saves
its LOCAL shards only, never the whole tensor.

What is stored, for a tensor of a saved state that is

* a DTensor (torch.distributed.tensor.DTensor, torch.distributed._tensor on
  older 2.x; FSDP2 ``fully_shard`` state dicts, FSDP1 with a device mesh):
  its local tensor (``to_local()``: no all-gather, no copy on rank 0) goes to
  the store as one named buffer, under the DTensor's path in the structure
  (e.g. ``model/blocks.0.fc.weight``), exactly like a plain tensor. The
  skeleton pickle gets, instead of the DTensor, the placement metadata needed
  to rebuild it: the device mesh (its device type, the ranks in its shape, the
  dimension names), the placements (Shard(dim), Replicate(), Partial(op),
  others pickled as they are), the global shape and stride, and whether it was
  an nn.Parameter.
* a ShardedTensor (torch.distributed._shard; FSDP1's SHARDED_STATE_DICT on
  torch versions that give ShardedTensor): each local shard's tensor goes to the
  store as a named buffer (the path, then ``/%shard1``, ``/%shard2``... for
  further shards of the same rank), and the skeleton gets each local shard's
  ShardMetadata and the tensor's global ShardedTensorMetadata.

Loading (ftrun.load) rebuilds them:

* a DTensor with ``DTensor.from_local(local, mesh, placements, shape=...,
  stride=..., run_check=False)`` (no communication), on a DeviceMesh of the
  saved device type and ranks - built once per layout over the current
  default process group (a 1-D mesh over the whole world reuses the default
  group) - or on the mesh given with ``ftrun.sharded.use_mesh(mesh)`` /
  ``ftrun.load(..., device_mesh=mesh)``. The local tensor goes where
  map_location says (by default the device it was saved from); the mesh's
  device type follows it.
* a ShardedTensor with ``ShardedTensor._init_from_local_shards_and_global_metadata``
  (no communication) over the default process group.

Putting a loaded state back into live sharded objects IN PLACE - the usual
restore, which needs no mesh at all - is restore_into(target, loaded)
(re-exported as ftrun.restore_into): it walks both structures and copies
every loaded tensor into the matching target tensor: a DTensor's local shard
with ``target.to_local().copy_(...)``, each local shard of a ShardedTensor,
plain tensors with ``copy_``; on whatever device the target lives.

torch 1.13 has neither class importable (its ShardedTensor module does not
even import on Python 3.11): this module never imports them; it recognises
them only when their module is already imported (sys.modules), which is
always the case when such a tensor exists.
"""

import sys

import torch

from .grad_flags import with_grad_flags

# Persistent ids of the skeleton pickle (state_pack / state_unpack hooks).
PID_DTENSOR = "ftrun.dtensor"
PID_SHARDED = "ftrun.sharded_tensor"
PIDS = (PID_DTENSOR, PID_SHARDED)

_DTENSOR_MODULES = ("torch.distributed.tensor", "torch.distributed._tensor")
_SHARDED_MODULE = "torch.distributed._shard.sharded_tensor"

_mesh_override = []   # stack of meshes given by use_mesh()
_mesh_cache = {}      # (device_type, ranks, shape, names) -> DeviceMesh


# --------------------------------------------------------------------------
# Recognising sharded tensors without importing anything


def _dtensor_class():
    for name in _DTENSOR_MODULES:
        mod = sys.modules.get(name)
        cls = getattr(mod, "DTensor", None) if mod is not None else None
        if cls is not None:
            return cls
    return None


def _sharded_tensor_class():
    mod = sys.modules.get(_SHARDED_MODULE)
    return getattr(mod, "ShardedTensor", None) if mod is not None else None


def is_dtensor(obj):
    cls = _dtensor_class()
    return cls is not None and isinstance(obj, cls)


def is_sharded_tensor(obj):
    cls = _sharded_tensor_class()
    return cls is not None and isinstance(obj, cls)


def is_sharded(obj):
    """Whether obj is a DTensor or a ShardedTensor (False on torch 1.13)."""
    return is_dtensor(obj) or is_sharded_tensor(obj)


# --------------------------------------------------------------------------
# Placements and meshes as plain data


def _encode_placement(p):
    kind = type(p).__name__
    if kind == "Shard" and hasattr(p, "dim"):
        return ("S", int(p.dim))
    if kind == "Replicate":
        return ("R",)
    if kind in ("Partial", "_Partial") and hasattr(p, "reduce_op"):
        return ("P", str(p.reduce_op))
    return ("pickle", p)  # e.g. _StridedShard: pickled as it is


def _placement_types():
    for name in ("torch.distributed.tensor.placement_types", "torch.distributed._tensor.placement_types"):
        mod = sys.modules.get(name)
        if mod is None:
            try:
                import importlib

                mod = importlib.import_module(name)
            except ImportError:
                continue
        return mod
    raise ImportError("this torch has no DTensor placement types (torch.distributed.tensor)")


def _decode_placement(code):
    if code[0] == "pickle":
        return code[1]
    pt = _placement_types()
    if code[0] == "S":
        return pt.Shard(code[1])
    if code[0] == "R":
        return pt.Replicate()
    if code[0] == "P":
        cls = getattr(pt, "Partial", None) or getattr(pt, "_Partial")
        return cls(code[1])
    raise ValueError(f"ftrun.sharded: unknown placement code {code!r}")


def _mesh_info(mesh):
    ranks = mesh.mesh.detach().cpu()
    names = getattr(mesh, "mesh_dim_names", None)
    return {
        "device_type": str(mesh.device_type),
        "shape": tuple(ranks.shape),
        "ranks": tuple(int(r) for r in ranks.reshape(-1).tolist()),
        "dim_names": tuple(names) if names else None,
    }


def _device_mesh_class():
    try:
        from torch.distributed.device_mesh import DeviceMesh  # torch >= 2.2
    except ImportError:
        from torch.distributed._tensor import DeviceMesh  # older 2.x
    return DeviceMesh


def _mesh_for(info, device_type):
    """The mesh a loaded DTensor goes on: use_mesh()'s, else one of the saved
    layout over the default process group (made once, then reused)."""
    if _mesh_override and _mesh_override[-1] is not None:
        return _mesh_override[-1]
    key = (device_type, info["ranks"], info["shape"], info["dim_names"])
    mesh = _mesh_cache.get(key)
    if mesh is None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ftrun.load: the state holds DTensors; initialize the default process group first "
                               "(or restore in place with ftrun.restore_into, or give a mesh: "
                               "ftrun.load(..., device_mesh=mesh))")
        world = dist.get_world_size()
        if max(info["ranks"], default=-1) >= world:
            raise RuntimeError(f"ftrun.load: a DTensor was saved on a mesh of ranks {list(info['ranks'])}, "
                               f"this job has {world} ranks")
        ranks = torch.tensor(info["ranks"], dtype=torch.int64).reshape(info["shape"])
        DeviceMesh = _device_mesh_class()
        if info["dim_names"]:
            mesh = DeviceMesh(device_type, ranks, mesh_dim_names=info["dim_names"])
        else:
            mesh = DeviceMesh(device_type, ranks)
        _mesh_cache[key] = mesh
    return mesh


class use_mesh:
    """Context manager: DTensors that ftrun.load rebuilds go on `mesh`
    (None: one of the saved layout over the default process group)."""

    def __init__(self, mesh):
        self.mesh = mesh

    def __enter__(self):
        _mesh_override.append(self.mesh)
        return self.mesh

    def __exit__(self, *exc):
        _mesh_override.pop()
        return False


# --------------------------------------------------------------------------
# The save side: called from state_pickle.Pickler.persistent_id


def persistent_id(obj, packer, names, prefix):
    """None when obj is no sharded tensor; else registers its local shard(s)
    with the packer (named by obj's path) and returns the persistent id that
    stands for obj in the skeleton."""
    if is_dtensor(obj):
        return _pack_dtensor(obj, packer, names, prefix)
    if is_sharded_tensor(obj):
        return _pack_sharded_tensor(obj, packer, names, prefix)
    return None


def _pack_dtensor(obj, packer, names, prefix):
    with torch.no_grad():
        local = obj.to_local()
    name = names.get(id(obj))
    idx = packer.add(local, {id(local): name} if name is not None else {}, prefix)
    info = {
        "mesh": _mesh_info(obj.device_mesh),
        "placements": tuple(_encode_placement(p) for p in obj.placements),
        "shape": tuple(obj.shape),
        "stride": tuple(obj.stride()),
        "requires_grad": bool(obj.requires_grad),
        "param": isinstance(obj, torch.nn.Parameter),
    }
    return (PID_DTENSOR, idx, info)


def _pack_sharded_tensor(obj, packer, names, prefix):
    name = names.get(id(obj))
    shards = []
    for i, shard in enumerate(obj.local_shards()):
        t = shard.tensor.detach()
        sub = name if (name is None or i == 0) else f"{name}/%shard{i}"
        idx = packer.add(t, {id(t): sub} if sub is not None else {}, prefix)
        shards.append((idx, shard.metadata))
    info = {"metadata": obj.metadata(), "shards": shards, "requires_grad": bool(obj.requires_grad)}
    return (PID_SHARDED, info)


# --------------------------------------------------------------------------
# The load side: called from state_unpack._Tensors (the persistent ids of a skeleton)


def persistent_load(pid, loaded, map_location, made):
    """Rebuilds the sharded tensor a persistent id of PIDS stands for. made:
    the unpickler's cache (the same object reached twice comes back once)."""
    if pid[0] == PID_SHARDED:
        key = (pid[0], tuple(idx for idx, _ in pid[1]["shards"]) or id(pid[1]))
    else:
        key = (pid[0], pid[1])
    out = made.get(key)
    if out is not None:
        return out
    if pid[0] == PID_DTENSOR:
        out = _load_dtensor(pid[1], pid[2], loaded, map_location)
    else:
        out = _load_sharded_tensor(pid[1], loaded, map_location)
    made[key] = out
    return out


def _load_dtensor(idx, info, loaded, map_location):
    local = loaded.tensor(idx, map_location)
    if isinstance(local, torch.nn.Parameter):
        local = local.detach()
    local = local.detach()
    mesh = _mesh_for(info["mesh"], local.device.type)
    placements = tuple(_decode_placement(c) for c in info["placements"])
    DTensor = _dtensor_class()
    if DTensor is None:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:
            from torch.distributed._tensor import DTensor
    out = DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(info["shape"]),
                             stride=tuple(info["stride"]))
    return with_grad_flags(out, info)


def _load_sharded_tensor(info, loaded, map_location):
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor

    shards = []
    for idx, md in info["shards"]:
        t = loaded.tensor(idx, map_location).detach()
        shards.append(Shard(tensor=t, metadata=md))
    st = ShardedTensor._init_from_local_shards_and_global_metadata(shards, info["metadata"])
    return st


# --------------------------------------------------------------------------
# In-place restore


def _local_of(t):
    """The tensor(s) holding t's local values: [local] for a DTensor, the
    local shards' tensors for a ShardedTensor, [t] for a plain tensor."""
    if is_dtensor(t):
        with torch.no_grad():
            return [t.to_local()]
    if is_sharded_tensor(t):
        return [s.tensor for s in t.local_shards()]
    return [t]


def _copy_tensor(dst, src, path):
    dsts, srcs = _local_of(dst), _local_of(src)
    if len(dsts) != len(srcs):
        raise ValueError(f"ftrun.restore_into: '{path}' has {len(dsts)} local shard(s) here, "
                         f"{len(srcs)} in the loaded state")
    with torch.no_grad():
        for d, s in zip(dsts, srcs):
            if tuple(d.shape) != tuple(s.shape):
                raise ValueError(f"ftrun.restore_into: '{path}' is {list(d.shape)} here (local shard), "
                                 f"{list(s.shape)} in the loaded state")
            d.copy_(s.detach())


def restore_into(target, loaded, _path=""):
    """Copies a loaded state into a live one IN PLACE and returns target.

    target: the structure to fill, e.g. {"model": model.state_dict(), "optim":
    optimizer.state_dict()} (their tensors share memory with the model's
    parameters and the optimizer's state), or a get_state_dict() result.
    loaded: the state ftrun.load returned. Every tensor of `loaded` is copied
    into the tensor at the same place in `target` (a DTensor's local shard, a
    ShardedTensor's local shards, a plain tensor; any device, copy_ moves the
    bytes). Where target has a non-tensor or no entry, a dict or list gets
    the loaded value put in (tuples cannot be: their non-tensor entries stay).
    Shapes must match (ValueError)."""
    if isinstance(target, torch.Tensor) and isinstance(loaded, torch.Tensor):
        _copy_tensor(target, loaded, _path or "/")
        return target
    if isinstance(target, dict) and isinstance(loaded, dict):
        for k, v in loaded.items():
            sub = f"{_path}/{k}"
            if k in target and _fillable(target[k], v):
                restore_into(target[k], v, sub)
            else:
                target[k] = v
        return target
    if isinstance(target, (list, tuple)) and isinstance(loaded, (list, tuple)):
        for i, v in enumerate(loaded):
            sub = f"{_path}/{i}"
            if i < len(target) and _fillable(target[i], v):
                restore_into(target[i], v, sub)
            elif isinstance(target, list):
                if i < len(target):
                    target[i] = v
                else:
                    target.append(v)
        return target
    raise ValueError(f"ftrun.restore_into: '{_path or '/'}' is a {type(target).__name__} here, "
                     f"a {type(loaded).__name__} in the loaded state")


def _fillable(t, v):
    if isinstance(t, torch.Tensor):
        return isinstance(v, torch.Tensor)
    if isinstance(t, dict):
        return isinstance(v, dict)
    if isinstance(t, (list, tuple)):
        return isinstance(v, (list, tuple))
    return False
