"""torch.distributed.checkpoint (DCP) storage backend: DCP's planners and
state-dict code, ftrun's peer-replicated RAM (then lazily disk) as the storage.

    import torch.distributed.checkpoint as dcp
    import ftrun.dcp

    dcp.save(state_dict, storage_writer=ftrun.dcp.StorageWriter(step))
    ...
    dcp.load(state_dict, storage_reader=ftrun.dcp.StorageReader())   # the version a restart restores

(torch >= 2.2; this module imports torch.distributed.checkpoint, so it is
imported only when used: `import ftrun` alone does not need it.)

What is stored: one DCP save is one ftrun version of every rank (the step).
Each rank stores the write items DCP's planner gave it - nothing else, so with
sharded state dicts (FSDP, DTensor) a rank stores its own shards:

* every tensor item (WriteItemType.TENSOR / SHARD: the planner's
  resolve_data, any device, views allowed) is one named buffer of the rank's
  version, named by its fully qualified name (with ``@offsets`` for a shard),
  saved through ftrun.state_pack like any ftrun.save tensor (CUDA tensors
  by the CUDA path, bfloat16 and other dtypes kept);
* every bytes item (WriteItemType.BYTE_IO: non-tensor values, pickled by the
  planner) goes into the version's pickled user bytes, whose length may change
  between saves (the tensor layout must not: ftrun keeps a rank's first
  layout);
* DCP's global Metadata (what the planner made, with storage_data mapping
  every item's MetadataIndex to (rank in the group, name)) goes into EVERY
  rank's user bytes, so read_metadata needs only the rank's own version. The
  coordinator builds it in prepare_global_plan from the final plans (DCP's
  create_default_global_save_plan, with the planners' planner_data merged, as
  DefaultSavePlanner does) and sends it, with the step, to every rank in its
  plan's storage_data.

dcp.async_save works with both checkpointers. The thread checkpointer: give
it and the writer their own process group (its collectives run beside the
next step's). The process checkpointer (AsyncCheckpointerType.PROCESS): the
writer is pickled to DCP's background process, a child of the rank in its
process group, and saves from there as a writer of the rank (the agent takes
one connection as the rank, and writers of it beside: ftrun.Client(writer=
True)); its process group there is the background process's own. Under
@ftrun.resilient, a warm recovery ends that process with the generation
(ftrun.warm_leave); the next async_save starts a new one.

With DDP: a StorageWriter records the rank's DDP gradient buckets when it is
made (ftrun.ddp_buckets; make one for each save), and StorageReader hands
them to the next DDP built, so a restored run reduces as the saving one did.

The step (ftrun version) is StorageWriter(step), or `checkpoint_id=step` of
dcp.save (an int, or a string of digits, or "ftrun:<step>"), or, when neither
is given, the coordinator's newest version + 1. Steps must increase.

Loading: every rank loads its own version (ftrun checks every chunk's hash)
and copies each read item into the tensor the planner resolves (resolve_tensor
/ commit_tensor, narrowed by the item's storage offsets and lengths; any
device) or hands bytes items to load_bytes. Items another rank stored (DCP
dedups replicated tensors and bytes items onto one rank at save) are passed
over the process group (all_gather_object of only those items): every rank of
the group must call dcp.load, as DCP requires anyway. The group is the one
given to the reader/writer (process_group=), by default the default group -
give the same one as to dcp.save / dcp.load.
"""

import dataclasses
import io
import os
import pickle
import sys
from collections import ChainMap

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import storage as _storage
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.futures import Future

from . import _ftrun, ddp_buckets
from .state_client import _ftrun_error, get_client, get_writer_client
from .state_pack import _FORMAT_VERSION, _Packer
from .state_unpack import _load_version

__all__ = ["StorageWriter", "StorageReader", "PersistedReader", "restore_version"]

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


def restore_version():
    """The version a restart restores, which StorageReader() loads (None: a fresh start)."""
    return get_client().restore_version


def _group_rank(group):
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group)
    return 0


def _item_key(index):
    """The store name of an item: its FQN, with @offsets for a shard."""
    if index.offset is None:
        return index.fqn
    return f"{index.fqn}@{','.join(str(int(o)) for o in index.offset)}"


class StorageWriter(_storage.StorageWriter):
    """DCP StorageWriter storing into ftrun (see the module docstring).

    step: the ftrun version (None: dcp.save's checkpoint_id, else the
    coordinator's newest version + 1). client: an ftrun.Client (default: the
    one ftrun.save uses). process_group: the group given to dcp.save (None:
    the default group)."""

    def __init__(self, step=None, *, client=None, process_group=None):
        super().__init__()
        self.step = None if step is None else _as_step(step)
        self._client = client
        self.process_group = process_group
        self.is_coordinator = False
        self.last_stats = None      # Client.save's statistics of this rank's last save
        self._pid = os.getpid()
        self._ddp = ddp_buckets.layouts_to_save()  # (here, in the rank: its DDP modules' gradient buckets)

    def __getstate__(self):
        # To DCP's background process (the process checkpointer): a connection and a process group stay in
        # their process; there the writer is a writer of the rank, in the background process's own group.
        state = dict(self.__dict__)
        state["_client"] = None
        state["process_group"] = None
        return state

    def _get_client(self, fresh=False):
        if os.getpid() != self._pid:
            return get_writer_client(fresh)
        return self._client if self._client is not None else get_client()

    def _save(self, step, tensors, user):
        for fresh in (False, True):
            packer = _Packer()
            user["skeleton"] = packer.pack(tensors)
            try:
                return packer.save(self._get_client(fresh), step, user)
            except _ftrun.Error as e:
                # A writer whose generation ended (a warm recovery kept this process, the agent refused the old
                # connection): once more, on a new connection.
                if fresh or os.getpid() == self._pid or e.code != "FAILED_PRECONDITION":
                    raise

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.step = _as_step(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _valid_id(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        from torch.distributed.checkpoint.default_planner import create_default_global_save_plan

        try:
            _, metadata = create_default_global_save_plan(plans, rewrite_index_hints=False)
        except TypeError:  # a torch whose helper always rewrites the hints (the planner already did)
            _, metadata = create_default_global_save_plan(plans)
        mappings = [p.planner_data for p in plans if isinstance(p.planner_data, dict)]
        if mappings:
            metadata = dataclasses.replace(metadata, planner_data=dict(ChainMap(*mappings)))
        where = {}
        for rank, plan in enumerate(plans):
            for item in plan.items:
                where[item.index] = (rank, _item_key(item.index))
        metadata = dataclasses.replace(metadata, storage_data=where)
        step = self.step
        if step is None:
            lv = self._get_client().list_versions()
            seen = list(lv["committed"]) + list(lv["pending"]) + ([lv["restore"]] if lv["restore"] is not None else [])
            step = max(seen) + 1 if seen else 0
        blob = pickle.dumps(metadata, protocol=4)
        return [dataclasses.replace(p, storage_data={"ftrun_step": step, "ftrun_metadata": blob}) for p in plans]

    def write_data(self, plan, planner):
        sd = plan.storage_data or {}
        if "ftrun_metadata" not in sd:
            raise _ftrun_error("FAILED_PRECONDITION", "ftrun.dcp.StorageWriter: the plan lacks the coordinator's "
                               "storage data (every rank must use ftrun.dcp.StorageWriter)")
        step = int(sd["ftrun_step"])
        tensors, blobs, results = {}, {}, []
        for item in plan.items:
            key = _item_key(item.index)
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                b = data.getvalue() if hasattr(data, "getvalue") else bytes(data)
                blobs[key] = b
                size = len(b)
            else:
                t = data.detach()
                tensors[key] = t
                size = t.numel() * t.element_size()
            results.append(_storage.WriteResult(index=item.index, size_in_bytes=size,
                                                storage_data=(_group_rank(self.process_group), key)))
        self.last_stats = self._save(step, tensors, {
            "format": _FORMAT, "format_version": _FORMAT_VERSION, "step": step,
            "bytes": blobs, "metadata": sd["ftrun_metadata"], "torch": torch.__version__, "ddp": self._ddp,
        })
        fut = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata, results):
        # Every rank's version already holds the metadata (prepare_global_plan); nothing is left to write.
        return None


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


from .dcp_persisted import PersistedReader  # noqa: E402  (a StorageReader: below this module's classes)
