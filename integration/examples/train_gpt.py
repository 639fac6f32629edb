"""A small GPT trained data-parallel with torch.distributed, saving its whole
state through ftrun every step (an example, and the rank of
tests/integration/test_train_gpt.py).

    build/ftrun --num_nodes 2 --num_gpus 2 integration/examples/train_gpt.py --steps 30

Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from
ftrun (a fresh MASTER_PORT per restart, so a new generation never meets the
rendezvous of the dead one) and `--local_rank=N` on its command line (ignored).

What it shows:

* Data parallelism: every rank computes the gradients of its own batch; the
  gradients are averaged with one all_reduce of a flat buffer (see
  sync_gradients for why not torch's DistributedDataParallel), and the
  optimizer is torch's ZeroRedundancyOptimizer(Adam): each rank keeps the Adam
  state of its shard of the parameters only, updates that shard and
  broadcasts it to the others.
* What a rank saves: the model (the same on every rank), its LOCAL optimizer
  shard (ZeroRedundancyOptimizer.optim.state_dict(), not the consolidated
  state, which would need a collective and the memory of all shards), the step
  and the random generators (dropout draws from the torch generator). The data
  of (step, rank) comes from a generator seeded with (seed, step, rank), so a
  restarted rank sees the same batches without saving a data position.
* Restore: ftrun.load() returns None on a fresh start, else (step, state) of
  the version the agent restores (the last one every rank saved); training goes
  on at step + 1 and ends bit-identical to a run without failures.

Output: rank 0 prints `LOSS <step> <mean loss over all ranks, float.hex()>`
for every step it runs (after a restart the steps after the restored version
are printed again), every rank prints `RESUMED <rank> <step>` after a restore
and `WEIGHTS <rank> <sha256 of every parameter's bytes, in order>` at the end.
"""
import argparse
import hashlib
import math
import os
import sys
import time

# Deterministic cuBLAS (needed by use_deterministic_algorithms on CUDA); must
# be set before CUDA is initialized.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

try:
    import ftrun
except ImportError as e:
    sys.stderr.write(
        f"train_gpt.py: cannot import ftrun ({e}).\n"
        "Run it under ftrun (build/ftrun or build/ftrun-agent) with the ftrun Python package on PYTHONPATH "
        "(PYTHONPATH=build/python).\n")
    sys.exit(2)

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-ms", type=float, default=0.0, help="sleep this long after every step")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="auto: nccl when CUDA is available, else gloo")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.d_model % a.heads:
        p.error(f"--d-model ({a.d_model}) must be a multiple of --heads ({a.heads})")
    if min(a.vocab, a.d_model, a.layers, a.heads, a.seq, a.batch) < 1 or a.steps < 0:
        p.error("sizes must be positive")
    return a


# --------------------------------------------------------------------------
# The model


class Block(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (self.drop(att) @ v).transpose(1, 2).reshape(b, t, d)
        return self.drop(self.proj(y))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok = nn.Embedding(a.vocab, a.d_model)
        self.pos = nn.Embedding(a.seq, a.d_model)
        self.drop = nn.Dropout(a.dropout)
        self.blocks = nn.ModuleList(Block(a.d_model, a.heads, a.dropout) for _ in range(a.layers))
        self.ln = nn.LayerNorm(a.d_model)
        self.head = nn.Linear(a.d_model, a.vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


# --------------------------------------------------------------------------
# Data


def batch(a, step, rank, device):
    """The batch of (step, rank), the same whoever asks and whenever: arithmetic
    sequences modulo the vocabulary (learnable), from a generator seeded with
    (seed, step, rank)."""
    g = torch.Generator().manual_seed((a.seed * 1_000_003 + step) * 4099 + rank)
    start = torch.randint(0, a.vocab, (a.batch, 1), generator=g)
    stride = torch.randint(1, 8, (a.batch, 1), generator=g)
    seq = (start + stride * torch.arange(a.seq + 1)) % a.vocab
    seq = seq.to(device)
    return seq[:, :-1], seq[:, 1:]


# --------------------------------------------------------------------------
# Training


def say(line):
    """One write per line: ranks share their agent's stdout."""
    os.write(1, (line + "\n").encode())


def sync_gradients(params, loss, world):
    """Averages the gradients (and the loss, for the log) over the ranks with
    one all_reduce of a flat buffer in parameter order.

    torch's DistributedDataParallel would do the same, but it regroups its
    buckets by the order gradients became ready after its first iteration, so
    the first step after a restart all-reduces a differently laid out buffer
    than the same step of an uninterrupted run; the ring all-reduce then adds
    an element's terms in another order and the result may differ in the last
    bit. A fixed layout keeps the sums bit-identical."""
    flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
    dist.all_reduce(flat)
    flat /= world
    off = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n
    return flat[off].item()


def weights_digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main():
    a = parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = a.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)

    torch.manual_seed(a.seed)  # every rank builds the same initial model
    model = GPT(a).to(device)
    params = list(model.parameters())
    opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=a.lr)
    torch.manual_seed(a.seed + 1 + rank)  # dropout masks differ between ranks
    if device.type == "cuda":
        torch.cuda.manual_seed(a.seed + 1 + rank)

    start = 0
    resumed = ftrun.load()
    if resumed is not None:
        step, state = resumed
        model.load_state_dict(state["model"])
        opt.optim.load_state_dict(state["optim"])  # this rank's shard only
        ftrun.set_rng_state(state["rng"])
        start = step + 1
        if state["step"] != step:
            raise RuntimeError(f"rank {rank}: version {step} holds the state of step {state['step']}")
        say(f"RESUMED {rank} {start}")
    # Every rank must go on from the same step (the agent restores one version for all).
    lo = torch.tensor([start, -start], dtype=torch.int64, device=device)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    if lo[0].item() != start or -lo[1].item() != start:
        raise RuntimeError(f"rank {rank} resumes at step {start}, others between {lo[0].item()} "
                           f"and {-lo[1].item()}")

    model.train()
    for step in range(start, a.steps):
        x, y = batch(a, step, rank, device)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        mean_loss = sync_gradients(params, loss, world)
        if rank == 0:
            say(f"LOSS {step} {float(mean_loss).hex()}")
        opt.step()
        ftrun.save(step, {"model": model.state_dict(), "optim": opt.optim.state_dict(), "step": step,
                          "rng": ftrun.rng_state()})
        if a.step_ms > 0:
            time.sleep(a.step_ms / 1000.0)

    ftrun.wait()  # the last step is committed before anyone reports
    dist.barrier()
    say(f"WEIGHTS {rank} {weights_digest(model)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
