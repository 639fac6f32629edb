"""ftrun.dcp's reader, and what its writer shares with it (the format name,
checkpoint ids as steps, the store names of items). `ftrun.dcp.StorageReader`
is this class: see ftrun.dcp's docstring. Below ftrun.dcp and
ftrun.dcp_persisted, which both import it."""
import dataclasses
import io
import pickle
import sys

import torch.distributed as dist
from torch.distributed.checkpoint import storage as _storage
from torch.distributed.checkpoint.planner import LoadItemType
from torch.futures import Future

from . import ddp_buckets
from .state_client import _ftrun_error, get_client
from .state_unpack import _load_version

_FORMAT = "ftrun.dcp"


def _as_step(checkpoint_id):
    """A checkpoint_id as an ftrun step: int, digits, or 'ftrun:<digits>'; None stays None."""
    if checkpoint_id is None:
        return None
    if isinstance(checkpoint_id, int):
        return int(checkpoint_id)
    s = str(checkpoint_id)
    if s.startswith("ftrun:"):
        s = s[len("ftrun:"):]
    if s.isdigit():
        return int(s)
    raise _ftrun_error("INVALID_ARGUMENT", f"ftrun.dcp: checkpoint_id {checkpoint_id!r} is not a step "
                       "(an int, digits, or 'ftrun:<step>')")


def _valid_id(checkpoint_id):
    try:
        return _as_step(checkpoint_id) is not None
    except Exception:
        return False


def _group_rank(group):
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group)
    return 0


def _item_key(index):
    """The store name of an item: its FQN, with @offsets for a shard."""
    if index.offset is None:
        return index.fqn
    return f"{index.fqn}@{','.join(str(int(o)) for o in index.offset)}"


class StorageReader(_storage.StorageReader):
    """DCP StorageReader loading from ftrun (see the module docstring).

    version: the ftrun version (None: dcp.load's checkpoint_id, else the
    version a restart restores, else the last committed one). client,
    process_group: as StorageWriter's. map_location: where loaded tensors are
    put before being copied into the planner's tensors (default 'cpu')."""

    def __init__(self, version=None, *, client=None, process_group=None, map_location="cpu"):
        super().__init__()
        self.version = None if version is None else _as_step(version)
        self._client = client
        self.process_group = process_group
        self.map_location = map_location
        self.is_coordinator = False
        self.metadata = None
        self._loaded = None
        self._objects = None

    def _get_client(self):
        return self._client if self._client is not None else get_client()

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.version = _as_step(checkpoint_id)
        self._loaded = None
        self._objects = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _valid_id(checkpoint_id)

    def _load(self):
        if self._loaded is None:
            loaded = _load_version(self._get_client(), self.version, _FORMAT)
            if loaded is None:
                raise _ftrun_error("NOT_FOUND", "ftrun.dcp.StorageReader: no version is committed")
            self._loaded = loaded
            ddp_buckets.restore(loaded.payload.get("ddp"))  # (the next DDP built reduces as the saving run did)
        return self._loaded

    def read_metadata(self, *args, **kwargs):
        try:
            return pickle.loads(self._load().payload["metadata"])
        except Exception as e:
            # dcp.load only logs this (at INFO) and then fails with "metadata is None": say why.
            print(f"ftrun.dcp.StorageReader: cannot read the DCP metadata of version {self.version}: "
                  f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
            raise

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.metadata = metadata
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        where = self.metadata.storage_data
        remote = any(where[ri.storage_index][0] != rank for rank, p in enumerate(plans) for ri in p.items)
        return [dataclasses.replace(p, storage_data={"ftrun_exchange": remote}) for p in plans]

    def _local_objects(self):
        if self._objects is None:
            loaded = self._load()
            tensors = loaded.unpack(loaded.payload["skeleton"], self.map_location)
            self._objects = (tensors, loaded.payload["bytes"])
        return self._objects

    def _sources(self, plan):
        """owner rank -> (its tensors, its bytes items), by store name, for the items of `plan`:
        this rank's own version, and what other ranks stored, passed over the process group."""
        me = _group_rank(self.process_group)
        own = self._local_objects()
        remote = {}
        if (plan.storage_data or {}).get("ftrun_exchange"):
            for (owner, key), obj in self._exchange(plan, self.metadata.storage_data, me, *own).items():
                remote.setdefault(owner, {})[key] = obj
        return lambda owner: own if owner == me else (remote.get(owner, {}),) * 2

    def read_data(self, plan, planner):
        where = self.metadata.storage_data
        sources = self._sources(plan)
        for ri in plan.items:
            owner, key = where[ri.storage_index]
            tensors, blobs = sources(owner)
            held = blobs if ri.type == LoadItemType.BYTE_IO else tensors
            if key not in held:
                raise _ftrun_error("CORRUPTION", f"ftrun.dcp: version {self.version} of rank {owner} lacks "
                                   f"item '{key}', which the checkpoint's metadata says it stored")
            if ri.type == LoadItemType.BYTE_IO:
                planner.load_bytes(ri, io.BytesIO(held[key]))
                continue
            src = held[key]
            for dim, (off, length) in enumerate(zip(ri.storage_offsets, ri.lengths)):
                src = src.narrow(dim, int(off), int(length))
            target = planner.resolve_tensor(ri).detach()
            if tuple(target.shape) != tuple(src.shape):
                raise _ftrun_error("INVALID_ARGUMENT", f"ftrun.dcp: item {ri.storage_index} is "
                                   f"{list(src.shape)} in the checkpoint, {list(target.shape)} here")
            target.copy_(src)
            planner.commit_tensor(ri, target)
        fut = Future()
        fut.set_result(None)
        return fut

    def _exchange(self, plan, where, me, tensors, blobs):
        """Items this rank needs that other ranks stored, and theirs from us: two all_gather_objects."""
        group = self.process_group
        world = dist.get_world_size(group)
        wanted = sorted({where[ri.storage_index] for ri in plan.items if where[ri.storage_index][0] != me})
        asks = [None] * world
        dist.all_gather_object(asks, wanted, group=group)
        offer = {}
        for ask in asks:
            for owner, key in ask or ():
                if owner == me and (owner, key) not in offer:
                    offer[(owner, key)] = blobs[key] if key in blobs else tensors[key]
        offers = [None] * world
        dist.all_gather_object(offers, offer, group=group)
        got = {}
        for o in offers:
            got.update(o or {})
        missing = [k for k in wanted if k not in got]
        if missing:
            raise _ftrun_error("CORRUPTION", f"ftrun.dcp: no rank sent the items {missing[:5]}")
        return {k: got[k] for k in wanted}
