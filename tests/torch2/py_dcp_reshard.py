"""Loads the version 1 that tests/torch2/py_dcp_rank.py's 4 ranks saved through
ftrun.dcp, from the job's persist directory with ftrun.dcp.PersistedReader,
no agent running, onto another world size: WORLD_SIZE ranks (gloo, FSDP2 over
them), or one process without a process group (a plain model: full tensors).
Rank 0 then compares the full model and optimizer state with what the saving
job gathered (<dir>/full-1.pt), tensor by tensor, bytes and dtypes, and prints
`RESHARD OK <world>`; any difference raises.

    py_dcp_reshard.py PERSIST_DIR JOB FULL_PT    (RANK, WORLD_SIZE, MASTER_ADDR/PORT for WORLD_SIZE > 1)"""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

import ftrun.dcp

persist_dir, job, full_pt = sys.argv[1:4]
world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))

torch.manual_seed(7)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))  # py_dcp_rank.py's model
if world > 1:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
opt = torch.optim.Adam(model.parameters(), lr=0.5)  # another lr: the loaded param groups must replace it
model(torch.randn(4, 16)).sum().backward()  # an optimizer state to load into
opt.step()
opt.zero_grad()

msd, osd = get_state_dict(model, opt)
state = {"model": msd, "optim": osd}
dcp.load(state, storage_reader=ftrun.dcp.PersistedReader(persist_dir, job, 1))
set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

options = StateDictOptions(full_state_dict=True, cpu_offload=world > 1)
got_model, got_optim = get_state_dict(model, opt, options=options)
if rank == 0:
    want = torch.load(full_pt, weights_only=False)

    def same(a, b, path):
        if isinstance(a, torch.Tensor):
            if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and
                    a.contiguous().view(-1).view(torch.uint8).equal(b.contiguous().view(-1).view(torch.uint8))):
                raise SystemExit(f"world {world}: {path} differs from the saving job's")
        elif isinstance(a, dict):
            if set(a) != set(b):
                raise SystemExit(f"world {world}: {path} has keys {sorted(map(str, b))}, "
                                 f"the saving job's {sorted(map(str, a))}")
            for k in a:
                same(a[k], b[k], f"{path}.{k}")
        elif isinstance(a, (list, tuple)):
            if len(a) != len(b):
                raise SystemExit(f"world {world}: {path} has {len(b)} entries, the saving job's {len(a)}")
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{path}[{i}]")
        elif a != b:
            raise SystemExit(f"world {world}: {path} is {b!r}, the saving job's {a!r}")

    same(want["model"], got_model, "model")
    same(want["optim"], got_optim, "optim")
    print(f"RESHARD OK {world}", flush=True)
if world > 1:
    dist.barrier()  # both ranks done before either tears gloo down (one aborted in teardown once)
    dist.destroy_process_group()
