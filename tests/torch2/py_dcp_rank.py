"""A rank of tests/torch2/test_dcp.py (4 ranks, gloo, CPU): an FSDP2 model and
its Adam state through torch.distributed.checkpoint with ftrun.dcp's storage.

1. dcp.save(model + optimizer state dict, storage_writer=ftrun.dcp.StorageWriter(1));
   a differently initialised model + optimizer; dcp.load(...,
   storage_reader=ftrun.dcp.StorageReader(1)); set_state_dict: the local shards,
   the optimizer state and the param groups equal the saved ones.
2. The same state saved by plain DCP (FileSystemWriter, a directory on disk),
   loaded by plain DCP into a third model, saved into ftrun (version 2), loaded
   from ftrun into a fourth model: equal to the original.
3. dcp.async_save (the thread checkpointer) into ftrun while the next
   optimizer step runs; loaded back: the state as it was at async_save.
4. The same with the process checkpointer: DCP's background process (a child
   of the rank) saves as a writer of the rank, twice (its connection kept),
   beside the rank's own connection; both versions load back as they were.

Rank 0 also writes the full (gathered) model and optimizer state of version 1
to <dir>/full-1.pt: tests/torch2/py_dcp_reshard.py compares its resharded
load of the persisted version 1 with it.

Prints `DCP OK <rank> <bytes stored by the first save> <local shard bytes>` at the end; any difference raises."""
import hashlib
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ftrun
import ftrun.dcp
from ftrun.sharded import _local_of

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
mesh = None  # main()'s


def say(line):
    """One write per line: the ranks share the agent's unbuffered stdout, where
    print() writes the text and its newline separately, so two ranks' lines interleave."""
    os.write(1, (line + "\n").encode())


def build(seed):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2 * seed)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(seed * 100 + rank))
    m(x).sum().backward()
    opt.step()
    opt.zero_grad()
    return m, opt


def state(m, opt):
    msd, osd = get_state_dict(m, opt)
    return {"model": msd, "optim": osd}


def digest(obj, h=None):
    top = h is None
    h = h or hashlib.sha256()
    if isinstance(obj, torch.Tensor):
        for t in _local_of(obj):
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(repr(k).encode())
            digest(obj[k], h)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            digest(v, h)
    else:
        h.update(repr(obj).encode())
    return h.hexdigest() if top else None


def local_bytes(obj):
    if isinstance(obj, torch.Tensor):
        return sum(t.numel() * t.element_size() for t in _local_of(obj))
    if isinstance(obj, dict):
        return sum(local_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(local_bytes(v) for v in obj)
    return 0


def expect(cond, what):
    if not cond:
        raise SystemExit(f"rank {rank}: {what}")


def main():
    """(Run only as the rank's script: DCP's process checkpointer spawns a process that imports this file.)"""
    global mesh
    # The runner puts --local_rank=N first (DeepSpeed's order): the directory is the other argument.
    shared = [a for a in sys.argv[1:] if not a.startswith("--local_rank")][0]
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))

    m1, o1 = build(1)
    sd1 = state(m1, o1)
    want = digest(sd1)

    # 1. DCP through ftrun and back.
    writer = ftrun.dcp.StorageWriter(1)
    dcp.save(sd1, storage_writer=writer)
    ftrun.get_client().wait_committed(1, timeout_ms=60000)
    stored = writer.last_stats["bytes_total"]
    full = get_state_dict(m1, o1, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"model": full[0], "optim": full[1]}, os.path.join(shared, "full-1.pt"))
    m2, o2 = build(2)
    sd2 = state(m2, o2)
    expect(digest(sd2) != want, "the second model starts equal to the first")
    dcp.load(sd2, storage_reader=ftrun.dcp.StorageReader(1))
    set_state_dict(m2, o2, model_state_dict=sd2["model"], optim_state_dict=sd2["optim"])
    expect(digest(state(m2, o2)) == want, "model/optimizer after dcp.load from ftrun differ from the saved ones")
    say(f"rank {rank}: dcp.save -> ftrun -> dcp.load equal")

    # 2. Plain DCP on disk -> ftrun -> back.
    disk = os.path.join(shared, "plain-dcp")
    dcp.save(sd1, checkpoint_id=disk)
    m3, o3 = build(3)
    sd3 = state(m3, o3)
    try:
        dcp.load(sd3, checkpoint_id=disk)
    except BaseException as e:  # DCP's CheckpointException is one; dcp.load only logs its reader's errors
        # Say what this rank sees on disk.
        say(f"rank {rank}: plain dcp.load of {disk} failed: {type(e).__name__}; the directory holds "
            f"{sorted(os.listdir(disk)) if os.path.isdir(disk) else 'nothing (no directory)'}")
        try:
            dcp.FileSystemReader(disk).read_metadata()
        except BaseException as why:
            say(f"rank {rank}: FileSystemReader.read_metadata: {type(why).__name__}: {why}")
        raise
    set_state_dict(m3, o3, model_state_dict=sd3["model"], optim_state_dict=sd3["optim"])
    sd3 = state(m3, o3)
    expect(digest(sd3) == want, "plain DCP disk round trip differs")
    dcp.save(sd3, storage_writer=ftrun.dcp.StorageWriter(checkpoint_id := 2))
    ftrun.get_client().wait_committed(checkpoint_id, timeout_ms=60000)
    m4, o4 = build(4)
    sd4 = state(m4, o4)
    dcp.load(sd4, storage_reader=ftrun.dcp.StorageReader())  # the newest committed version: 2
    set_state_dict(m4, o4, model_state_dict=sd4["model"], optim_state_dict=sd4["optim"])
    expect(digest(state(m4, o4)) == want, "disk DCP -> ftrun -> load differs")
    say(f"rank {rank}: plain DCP on disk -> ftrun -> back equal")

    # 3. dcp.async_save through ftrun (the thread checkpointer): training goes on while the version is written;
    # the version holds the state as it was when async_save returned.
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    m5, o5 = build(5)
    sd5 = state(m5, o5)
    want5 = digest(sd5)
    # (async_save's collectives run in its thread: on their own group, not among the next step's FSDP collectives)
    group = dist.new_group(backend="gloo")
    future = dcp.async_save(sd5, storage_writer=ftrun.dcp.StorageWriter(3, process_group=group), process_group=group,
                            async_checkpointer_type=AsyncCheckpointerType.THREAD)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(500 + rank))
    m5(x).sum().backward()  # the next step, while the save runs
    o5.step()
    expect(digest(state(m5, o5)) != want5, "the step after async_save changed nothing")
    future.result()
    ftrun.get_client().wait_committed(3, timeout_ms=60000)
    m6, o6 = build(6)
    sd6 = state(m6, o6)
    dcp.load(sd6, storage_reader=ftrun.dcp.StorageReader(3))
    set_state_dict(m6, o6, model_state_dict=sd6["model"], optim_state_dict=sd6["optim"])
    expect(digest(state(m6, o6)) == want5, "dcp.async_save -> ftrun -> dcp.load differs from the state at async_save")
    say(f"rank {rank}: dcp.async_save -> ftrun -> dcp.load equal")

    # 4. The process checkpointer: the writer is pickled to DCP's background process, which saves as a writer of
    # this rank while this process keeps its own connection (it loads below).
    for v, seed in ((4, 7), (5, 8)):
        m7, o7 = build(seed)
        sd7 = state(m7, o7)
        want7 = digest(sd7)
        future = dcp.async_save(sd7, storage_writer=ftrun.dcp.StorageWriter(v),
                                async_checkpointer_type=AsyncCheckpointerType.PROCESS)
        m7(torch.randn(4, 16, generator=torch.Generator().manual_seed(600 + rank))).sum().backward()
        o7.step()
        future.result()
        ftrun.get_client().wait_committed(v, timeout_ms=60000)
        m8, o8 = build(9)
        sd8 = state(m8, o8)
        dcp.load(sd8, storage_reader=ftrun.dcp.StorageReader(v))
        set_state_dict(m8, o8, model_state_dict=sd8["model"], optim_state_dict=sd8["optim"])
        expect(digest(state(m8, o8)) == want7, f"dcp.async_save (process) -> ftrun -> dcp.load differs (version {v})")
    say(f"rank {rank}: dcp.async_save with the process checkpointer -> ftrun -> dcp.load equal")
    # A writer lists versions and nothing more: its load is refused, naming why (a child of this rank).
    probe = ("import ftrun\nc = ftrun.Client(writer=True)\nprint('LISTED', 5 in c.list_versions()['committed'])\n"
             "try:\n    c.load(5)\nexcept ftrun.Error as e:\n    print('REFUSED', e.code, e.message)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60).stdout
    expect("LISTED True" in out and f"REFUSED FAILED_PRECONDITION a writer of rank {rank} saves and lists "
           "versions only" in out, f"a writer's list and load: {out!r}")

    dist.barrier()
    say(f"DCP OK {rank} {stored} {local_bytes(sd1)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
