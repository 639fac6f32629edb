"""nanoGPT's way of training, under ftrun: a GPT with tied embedding and output
weights, wrapped in torch's DistributedDataParallel, gradient accumulation
that turns DDP's gradient sync off for all but the last micro-step
(`model.require_backward_grad_sync`, as nanoGPT's train.py does), dropout,
AdamW; ftrun.save every iteration and ftrun.load at start, where nanoGPT calls
torch.save and torch.load (the example of the README's DDP section, and the
rank of tests/integration/test_ddp_exact.py).

    ftrun --num_nodes 2 --num_gpus 2 integration/examples/train_ddp.py --steps 30

A run killed and restarted any number of times ends bit-identical to the run
without failures (every loss, every rank's final weights): ftrun keeps DDP's
rebuilt gradient buckets with the state and gives them to the DDP built after
the restart (ftrun.ddp_buckets; docs/architecture.md). --resilient runs it
under @ftrun.resilient: after a failure the surviving processes keep their
model and run main() again, restored in place by ftrun.restore.

Output: rank 0 prints `LOSS <step> <its last micro-batch's loss, float.hex()>`
for every step it runs, every rank `RESUMED <rank> <step>` after a restore and
`WEIGHTS <rank> <sha256 of every parameter's bytes>` at the end.
"""
import argparse
import os
import sys
import time

try:
    import ftrun
except ImportError as e:
    sys.stderr.write(f"train_ddp.py: cannot import ftrun ({e}); run it under ftrun or ftrun-agent\n")
    sys.exit(2)

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import own_checkpoint  # noqa: E402  (beside this script)
from train_gpt import GPT, batch, say, weights_digest  # noqa: E402


def parse_args(argv=None, own=()):
    """own: the --checkpoint kinds the script saves with besides ftrun and none (own_checkpoint.KINDS:
    train_ddp.py; "own": train_lightning.py); the others save through ftrun only."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=1234, help="the model's initialization and the data")
    p.add_argument("--accum", type=int, default=2, help="gradient accumulation micro-steps per step")
    p.add_argument("--find-unused", action="store_true", help="DDP(find_unused_parameters=True)")
    p.add_argument("--static-graph", action="store_true", help="DDP(static_graph=True)")
    p.add_argument("--wrap-first", action="store_true",
                   help="build the DDP before ftrun.load (as Lightning does) instead of after (as nanoGPT does)")
    p.add_argument("--resilient", action="store_true",
                   help="run under @ftrun.resilient: warm recovery in the surviving processes (ftrun.restore)")
    p.add_argument("--fsdp", action="store_true", help="train_fabric.py and train_lightning.py: Lightning's "
                   "FSDPStrategy in lit-gpt's configuration, sharded state dicts (lightning_fsdp.py)")
    p.add_argument("--fsdp-save", choices=("local", "sharded"), default="local",
                   help="train_lightning.py --fsdp: ftrun.lightning.Checkpoint(fsdp=...): the rank's FSDP shards as "
                   "it holds them (local), or the strategy's sharded state dicts")
    p.add_argument("--step-ms", type=float, default=0, help="sleep this long every step (tests: kills land mid-run)")
    p.add_argument("--checkpoint", default="ftrun", metavar="ftrun|none|own:DIR|dcp:DIR|...",
                   help="train_ddp.py and train_lightning.py: ftrun (the default), nothing, or the stack's own "
                   "checkpoint in DIR (train_ddp.py: also DCP's, dcp:, dcp_async: or dcp_process:), run by "
                   "torchrun (own_checkpoint.py; bench/stack_recovery.py)")
    p.add_argument("--dcp", choices=("dcp", "dcp_async", "dcp_process"), default=None,
                   help="train_ddp.py: save with dcp.save / dcp.async_save (its thread or process checkpointer) "
                   "into ftrun (ftrun.dcp's storage) and restore with dcp.load, instead of ftrun.save / ftrun.load")
    p.add_argument("--overlap", action="store_true", help="ftrun.save(overlap=True): the copy into the store "
                   "runs beside the next step's forward and backward pass (train_lightning.py: "
                   "ftrun.lightning.Checkpoint(overlap=True))")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.accum < 1 or a.steps < 0 or a.d_model % a.heads:
        p.error("--accum must be >= 1, --steps >= 0, --d-model a multiple of --heads")
    own_checkpoint.parse(p, a, own or ("own",))
    if a.dcp and a.checkpoint != "ftrun":
        p.error(f"--dcp saves into ftrun: not with --checkpoint {a.checkpoint}")
    if a.checkpoint != "ftrun" and (a.resilient or not own):
        p.error("--resilient restores through ftrun: --checkpoint ftrun" if own else
                f"--checkpoint {a.checkpoint}: {p.prog} saves through ftrun only")
    return a


class TiedGPT(GPT):
    """train_gpt's GPT in nanoGPT's shape: the output layer's weight IS the token embedding's."""

    def __init__(self, a):
        super().__init__(a)
        self.head.weight = self.tok.weight
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)


def sequences(n, length, vocab, seed):
    """n arithmetic sequences modulo the vocabulary (learnable), fixed by the seed:
    the datasets of train_lightning.py and train_hf.py."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    stride = torch.randint(1, 8, (n, 1), generator=g)
    return (start + stride * torch.arange(length)) % vocab


def model_state(raw, optimizer):
    """What train() saves of the model and the optimizer by default (train_fabric.py --fsdp gives its
    sharded state dicts instead)."""
    return {"model": raw.state_dict(), "optim": optimizer.state_dict()}


def put_model_state(raw, optimizer, state):
    raw.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])


def resume(raw, optimizer, rank, put=put_model_state):
    """ftrun.load where nanoGPT calls torch.load: the step to go on from (0 on a fresh start)."""
    resumed = ftrun.load()
    if resumed is None:
        return 0
    step, state = resumed
    put(raw, optimizer, state)
    ftrun.set_rng_state(state["rng"])
    say(f"RESUMED {rank} {step}")
    return step + 1


def train(a, rank, raw, optimizer, start, micro_step, state=model_state, digest=weights_digest, own=None):
    """Steps start .. a.steps - 1, a.accum micro-batches each (micro_step(x, y, last) runs the forward and
    backward pass, the gradient sync only when last, and returns the loss), ftrun.save after every step
    of state(raw, optimizer) and the generators (own: own_checkpoint.NanoGPTCheckpoint's save instead;
    --checkpoint none: nothing); at the end, every rank's digest(raw)."""
    for step in range(start, a.steps):
        for micro in range(a.accum):
            x, y = batch(a, step * a.accum + micro, rank, "cpu")
            loss = micro_step(x, y, micro == a.accum - 1)
        if own is not None:
            own.before_update()  # (an async save's staging must be done first)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            say(f"LOSS {step} {loss.item().hex()}")
        if own is not None:
            own.save(step, raw, optimizer)
        elif a.checkpoint == "ftrun":
            ftrun.save(step, dict(state(raw, optimizer), rng=ftrun.rng_state()), overlap=a.overlap)
        if a.step_ms:
            time.sleep(a.step_ms / 1000)
    if a.checkpoint == "ftrun":
        ftrun.wait()
    if own is not None:
        own.finish()
    say(f"WEIGHTS {rank} {digest(raw)}")


def new_model(a):
    torch.manual_seed(a.seed)
    return TiedGPT(a)


def main(ctx=None):
    """One run; ctx: @ftrun.resilient's context (--resilient), else None."""
    a = parse_args(own=own_checkpoint.KINDS)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    # Warm recovery keeps the model in the process (a survivor's, or a standby's built before it had a rank).
    raw = ctx.keep("model", lambda: new_model(a)) if ctx is not None else new_model(a)
    optimizer = torch.optim.AdamW(raw.parameters(), lr=3e-3, weight_decay=0.1)
    wrap = lambda: DDP(raw, find_unused_parameters=a.find_unused, static_graph=a.static_graph)  # noqa: E731
    model = wrap() if a.wrap_first else None
    torch.manual_seed(a.seed + 1 + rank)  # dropout: each rank its own stream
    own = own_checkpoint.for_ddp(a.own_kind, a.own_dir, rank) if a.own_dir else None
    if a.dcp:  # DCP's own calls, into ftrun: restored by dcp.load, warm or cold
        own = own_checkpoint.FtrunDcpCheckpoint(a.dcp, rank)
    if ctx is not None and own is None:
        start = ftrun.restore(model=raw, optim=optimizer)  # in place, generators included
        if start:
            say(f"RESUMED {rank} {start - 1}")
    elif own is not None:
        step = own.load(raw, optimizer)
        if step is not None:
            say(f"RESUMED {rank} {step}")
        start = 0 if step is None else step + 1
    else:
        start = resume(raw, optimizer, rank) if a.checkpoint == "ftrun" else 0
    model = model or wrap()

    def micro_step(x, y, last):
        model.require_backward_grad_sync = last  # nanoGPT's no_sync
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / a.accum
        loss.backward()
        return loss

    train(a, rank, raw, optimizer, start, micro_step, own=own)
    dist.destroy_process_group()


if __name__ == "__main__":
    if "--resilient" in sys.argv[1:]:  # warm recovery: main(ctx) runs again in this process after a failure
        ftrun.resilient(main, prepare=lambda: {"model": new_model(parse_args(own=own_checkpoint.KINDS))})()
    else:
        main()
