"""ftrun.dcp.PersistedReader: a DCP StorageReader over a version in a persist
directory, read without any agent, onto any world size (resharding). Imported
by ftrun.dcp, which names it."""

import os

from .dcp_reader import _FORMAT, StorageReader
from .state_unpack import _Loaded


class PersistedReader(StorageReader):
    """DCP StorageReader over a version that ftrun wrote to a persist
    directory (persist.dir), read without any agent, onto any world size:
    resharding. The loading job may have another number of ranks than the one
    that saved (or be one process without a process group, which gets full
    tensors); DCP's planner maps every saved shard onto this rank's shards.

        reader = ftrun.dcp.PersistedReader("/data/ftrun", "my-job")      # the newest complete version
        dcp.load(state, storage_reader=reader)

    Each rank reads, whole and hash-checked, the files of every saving rank
    whose items it needs (all of them, for a process loading full tensors).
    version None: the newest complete version when the reader first reads;
    give the version when the saving job may still be writing newer ones."""

    def __init__(self, dir, job, version=None, *, map_location="cpu"):
        super().__init__(version, map_location=map_location)
        self.dir = os.fspath(dir)
        self.job = job
        self._ranks = {}

    def reset(self, checkpoint_id=None):
        super().reset(checkpoint_id)
        self._ranks = {}

    def _rank_objects(self, rank):
        """(tensors, bytes items) of saving rank `rank` of the version, read once."""
        if rank not in self._ranks:
            from .persisted import read_persisted

            loaded = _Loaded(read_persisted(self.dir, self.job, self.version, rank), _FORMAT)
            self.version = loaded.version  # None named the newest: keep every later read on that one
            self._ranks[rank] = (loaded, loaded.unpack(loaded.payload["skeleton"], self.map_location),
                                 loaded.payload["bytes"])
        return self._ranks[rank]

    def _load(self):
        return self._rank_objects(0)[0]  # every saving rank's version holds the global metadata

    def prepare_global_plan(self, plans):
        return plans  # each rank reads what it needs from the files: nothing is exchanged

    def _sources(self, plan):
        return lambda owner: self._rank_objects(owner)[1:]
