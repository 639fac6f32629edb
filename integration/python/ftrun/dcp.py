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
import os
import pickle
from collections import ChainMap

import torch
from torch.distributed.checkpoint import storage as _storage
from torch.distributed.checkpoint.planner import WriteItemType
from torch.futures import Future

from . import _ftrun, ddp_buckets
from .dcp_persisted import PersistedReader
from .dcp_reader import _FORMAT, StorageReader, _as_step, _group_rank, _item_key, _valid_id
from .state_client import _ftrun_error, get_client, get_writer_client
from .state_pack import _FORMAT_VERSION, _Packer

__all__ = ["StorageWriter", "StorageReader", "PersistedReader", "restore_version"]


def restore_version():
    """The version a restart restores, which StorageReader() loads (None: a fresh start)."""
    return get_client().restore_version


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
