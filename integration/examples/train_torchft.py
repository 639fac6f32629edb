"""train_ddp.py's job under torchft instead of ftrun: the peer bench/stack_recovery.py measures ftrun
against (`--stacks ddp --peers torchft`). Not an ftrun example: nothing of ftrun runs here.

torchft 0.2.0 as its own DDP example sets it up: each process is a replica group of one rank
(REPLICA_GROUP_ID of NUM_REPLICA_GROUPS, here the rank of train_ddp.py's 4, so that every group trains on
the batches that rank would), a torchft Manager per group reaching the Lighthouse at TORCHFT_LIGHTHOUSE,
torchft's ProcessGroupGloo across the groups, its DistributedDataParallel and Optimizer wrappers. Each
step's zero_grad begins a quorum; a group that dies is dropped from the next quorum and the others go
on; restarted (by its own launcher, as torchrun restarts a replica group), it joins the next quorum and
heals: the Manager fetches the model and optimizer state from a healthy group (its
checkpoint transport) and calls load_state_dict. Checkpoints on disk are left to the user (torchft's
example does not write any); this script writes none.

Lines: rank 0 (group 0) prints `LOSS <step> <hex>` as train_ddp.py does; every group prints
`STARTED <group>` when its process begins, `STEP <group> <step>` when a step of its commits and
`RESUMED <group> <step>` when it healed; at the end
`WEIGHTS <group> <digest>`. A group that runs alone (the others gone) still steps, with fewer
gradients: torchft trades exactness for never stopping.
"""
import datetime
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_ddp import new_model, parse_args  # noqa: E402  (beside this script)
from train_gpt import batch, say, weights_digest  # noqa: E402


def main():
    import torchft

    a = parse_args()
    group = int(os.environ["REPLICA_GROUP_ID"])
    say(f"STARTED {group}")
    torch.use_deterministic_algorithms(True)
    # The replica group's store, as torchrun's agent hosts it for its workers (one rank per group).
    store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=True,
                                       wait_for_workers=False)
    raw = new_model(a)
    inner = torch.optim.AdamW(raw.parameters(), lr=3e-3, weight_decay=0.1)
    torch.manual_seed(a.seed + 1 + group)  # dropout: each group its own stream

    def state_dict():
        return {"model": raw.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd):
        raw.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])
        say(f"RESUMED {group} {manager.current_step() - 1}")

    pg = torchft.ProcessGroupGloo(timeout=datetime.timedelta(seconds=10))
    manager = torchft.Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
                              replica_id=f"ftrun_bench_{group}", timeout=datetime.timedelta(seconds=10),
                              rank=0, world_size=1)
    model = torchft.DistributedDataParallel(manager, raw)
    optimizer = torchft.Optimizer(manager, inner)
    while manager.current_step() < a.steps:
        optimizer.zero_grad()  # begins the step's quorum
        step = manager.current_step()
        for micro in range(a.accum):
            x, y = batch(a, step * a.accum + micro, group, "cpu")
            model.require_backward_grad_sync = micro == a.accum - 1  # nanoGPT's no_sync
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / a.accum
            loss.backward()
        optimizer.step()
        # The step it committed, if it did (else a group failed in it, and it runs again): a group healing in
        # this step began it at its own count and ends it at the others'.
        done = manager.current_step() - 1
        if done >= step:
            if group == 0:
                say(f"LOSS {done} {loss.item().hex()}")
            say(f"STEP {group} {done}")
        if a.step_ms:
            time.sleep(a.step_ms / 1000)
    say(f"WEIGHTS {group} {weights_digest(raw)}")
    manager.shutdown()
    del store


if __name__ == "__main__":
    main()
