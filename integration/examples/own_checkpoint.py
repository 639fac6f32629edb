"""The checkpoints users have without ftrun, which bench/stack_recovery.py
measures ftrun against (`--checkpoint own:DIR` of train_ddp.py,
train_lightning.py and train_hf.py; `--checkpoint none` saves nothing: the
step time without checkpoints):

* train_ddp.py: nanoGPT's own. Rank 0 torch.saves the model's and the
  optimizer's state dicts and the step to DIR/ckpt.pt after every step
  (written to a temporary name and renamed, so a kill never leaves half a
  file; nanoGPT writes in place), and every rank of a restarted job
  torch.loads it. The generators are not saved (nanoGPT does not).
* train_lightning.py: Lightning's ModelCheckpoint (every optimizer step, the
  newest as DIR/last.ckpt; with --fsdp a directory of shards, which
  Lightning's FSDPStrategy writes with DCP's dcp.save and reads with
  dcp.load: the FSDP stack's own checkpoint is DCP's sync save) and
  `trainer.fit(ckpt_path=...)` from it.
* train_hf.py: the Trainer's own (`save_steps=1` into DIR/checkpoint-<step>,
  `resume_from_checkpoint` from the newest).

train_ddp.py also saves through PyTorch's distributed checkpoint (DCP), as
its documentation recommends for fast checkpoints (DcpCheckpoint):
`--checkpoint dcp:DIR` (dcp.save), `dcp_async:DIR` (dcp.async_save, its
writer in a thread) and `dcp_process:DIR` (in a process of its own,
AsyncCheckpointerType.PROCESS), the async ones with a stager kept across
saves (its buffers reused; shared memory for the process), staging in the
background, and the save plan cached.

train_ddp.py --dcp dcp|dcp_async|dcp_process makes the same DCP calls with
ftrun.dcp as their storage instead of a directory (FtrunDcpCheckpoint): what
a DCP user changes to use ftrun.
"""
import os

import torch
import torch.distributed


KINDS = ("own", "dcp", "dcp_async", "dcp_process")


def parse(p, a, kinds=("own",)):
    """Checks a.checkpoint (ftrun, none or KIND:DIR with KIND one of `kinds`); a.own_kind and a.own_dir: KIND
    and DIR, or None."""
    kind, _, d = a.checkpoint.partition(":")
    if a.checkpoint not in ("ftrun", "none") and not (kind in kinds and d):
        p.error(f"--checkpoint must be ftrun, none or one of {', '.join(k + ':DIR' for k in kinds)}, "
                f"not '{a.checkpoint}'")
    a.own_kind, a.own_dir = (kind, d) if kind in kinds and d else (None, None)
    if a.own_dir:
        os.makedirs(a.own_dir, exist_ok=True)


def for_ddp(kind, directory, rank):
    """The checkpoint train_ddp.py saves with --checkpoint KIND:DIR."""
    return NanoGPTCheckpoint(directory, rank) if kind == "own" else DcpCheckpoint(kind, directory, rank)


class NanoGPTCheckpoint:
    """nanoGPT's checkpoint: rank 0 torch.saves {model, optimizer, iter_num}; every rank loads it."""

    def __init__(self, directory, rank):
        self.path = os.path.join(directory, "ckpt.pt")
        self.rank = rank

    def load(self, raw, optimizer):
        """The step saved last (its state put into raw and optimizer), or None."""
        if not os.path.exists(self.path):
            return None
        ckpt = torch.load(self.path, map_location="cpu", weights_only=False)
        raw.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        return ckpt["iter_num"]

    def save(self, step, raw, optimizer):
        if self.rank != 0:
            return
        tmp = self.path + ".tmp"
        torch.save({"model": raw.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": step}, tmp)
        os.replace(tmp, self.path)

    def before_update(self):
        pass

    def finish(self):
        pass


class DcpCheckpoint:
    """DCP: every rank saves {model, optim} (torch.distributed.checkpoint.state_dict's get_state_dict) into
    DIR/step-<N>; a step counts once DCP has written its .metadata (the last file it writes), and a restarted
    job dcp.loads the newest such step. The two newest are kept. The async modes have one save in flight at a
    time (the next waits for it, as DCP's documentation does) and stage in the background: the optimizer waits
    for the staging before it changes the weights (before_update)."""

    def __init__(self, kind, directory, rank, plan_caching=True):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.dcp, self.kind, self.dir, self.rank = dcp, kind, directory, rank
        self.planner = dcp.DefaultSavePlanner(enable_plan_caching=plan_caching)
        self.response = None  # the async save in flight
        self.group = None
        if kind != "dcp":
            self.type = AsyncCheckpointerType.PROCESS if kind == "dcp_process" else AsyncCheckpointerType.THREAD
            if kind == "dcp_async":  # its collectives beside the training's: a group of their own (else they cross)
                self.group = torch.distributed.new_group(backend="gloo")
            # (pinned memory needs CUDA: these ranks are CPU processes)
            self.stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=kind == "dcp_process",
                                                       use_async_staging=True, use_non_blocking_copy=False))

    def _complete(self):
        steps = []
        for name in os.listdir(self.dir):
            if name.startswith("step-") and os.path.exists(os.path.join(self.dir, name, ".metadata")):
                steps.append(int(name[5:]))
        return sorted(steps)

    def _state(self, raw, optimizer):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(raw, optimizer)
        return {"model": model, "optim": optim}

    def load(self, raw, optimizer):
        from torch.distributed.checkpoint.state_dict import set_state_dict

        steps = self._complete()
        if not steps:
            return None
        state = self._state(raw, optimizer)
        self.dcp.load(state, checkpoint_id=os.path.join(self.dir, f"step-{steps[-1]:08d}"))
        set_state_dict(raw, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return steps[-1]

    def save(self, step, raw, optimizer):
        self._save(self._state(raw, optimizer), planner=self.planner,
                   checkpoint_id=os.path.join(self.dir, f"step-{step:08d}"))
        self._prune()

    def _save(self, state, **where):
        if self.kind == "dcp":
            self.dcp.save(state, **where)
        else:
            self._wait()
            self.response = self.dcp.async_save(state, process_group=self.group, async_checkpointer_type=self.type,
                                                async_stager=self.stager, **where)

    def before_update(self):
        if self.response is not None and hasattr(self.response, "staging_completion"):
            self.response.staging_completion.result()

    def _wait(self):
        if self.response is not None:
            done = getattr(self.response, "upload_completion", self.response)
            done.result()
            self.response = None

    def _prune(self):
        if self.rank != 0:
            return
        import shutil

        for step in self._complete()[:-2]:
            shutil.rmtree(os.path.join(self.dir, f"step-{step:08d}"), ignore_errors=True)

    def finish(self):
        self._wait()
        if self.kind != "dcp":
            self.stager.close()


class FtrunDcpCheckpoint(DcpCheckpoint):
    """DcpCheckpoint's DCP calls with ftrun.dcp's storage: ftrun.dcp.StorageWriter(step) for every save (it
    records the rank's DDP gradient buckets: a restored run reduces as the saving one did) and
    ftrun.dcp.StorageReader() for the version a restart restores. Each rank's generators go with its state
    (under its own key: DCP keeps one copy of a key that every rank saves), so a restart is bit-identical."""

    def __init__(self, kind, rank):
        super().__init__(kind, None, rank, plan_caching=False)  # (the plan names the step: made every save)

    def _state(self, raw, optimizer):
        import pickle

        import ftrun

        return dict(super()._state(raw, optimizer), **{f"rng{self.rank}": pickle.dumps(ftrun.rng_state())})

    def load(self, raw, optimizer):
        import pickle

        from torch.distributed.checkpoint.state_dict import set_state_dict

        import ftrun
        import ftrun.dcp

        version = ftrun.dcp.restore_version()
        if version is None:
            return None
        state = self._state(raw, optimizer)
        self.dcp.load(state, storage_reader=ftrun.dcp.StorageReader())
        set_state_dict(raw, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        ftrun.set_rng_state(pickle.loads(state[f"rng{self.rank}"]))
        return version

    def save(self, step, raw, optimizer):
        import ftrun.dcp

        self._save(self._state(raw, optimizer), planner=self.planner,
                   storage_writer=ftrun.dcp.StorageWriter(step, process_group=self.group))

    def _prune(self):
        pass  # (ftrun keeps its versions: store.keep_versions)
