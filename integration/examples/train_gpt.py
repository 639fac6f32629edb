"""A small GPT trained data-parallel with torch.distributed, saving its whole
state through ftrun every step (an example, and the rank of
tests/integration/test_train_gpt.py).

    ftrun --num_nodes 2 --num_gpus 2 integration/examples/train_gpt.py --steps 30

Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from
ftrun (a fresh MASTER_PORT per restart) and `--local_rank=N` (ignored).

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

Benchmark options (`--checkpoint torch:DIR`, `--timing`, `--fsdp`, sizes):
train_gpt_checkpoints.py's docstring. `--resilient`: @ftrun.resilient (README).
"""
import argparse
import hashlib
import math
import os
import resource
import sys
import time

_T_SCRIPT = time.monotonic()  # the interpreter is up and runs this script

# Deterministic cuBLAS (needed by use_deterministic_algorithms on CUDA); must
# be set before CUDA is initialized.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

try:
    import ftrun
except ImportError as e:
    sys.stderr.write(
        f"train_gpt.py: cannot import ftrun ({e}).\n"
        "Run it under ftrun or ftrun-agent (they give their ranks their own ftrun package), or put the "
        "package on PYTHONPATH yourself (a build tree's build/python; docs/install.md).\n")
    sys.exit(2)

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer

# The checkpoint backends: ftrun, or the status quo (beside this script).
from train_gpt_checkpoints import FtrunCheckpoint, TorchCheckpoint, tensor_bytes  # noqa: E402
from train_gpt_fsdp import (fsdp_mean_loss, fsdp_restore, fsdp_state, local_digest, local_tensors,  # noqa: E402
                            saved_line, sharded_model)

_T_IMPORTED = time.monotonic()  # ftrun and torch imported


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
    p.add_argument("--hold-file", metavar="PATH", default=None,
                   help="(tests) after every step, wait while PATH exists: a test holds training between failures")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="auto: nccl when CUDA is available, else gloo")
    p.add_argument("--checkpoint", default="ftrun", metavar="ftrun|torch:DIR",
                   help="ftrun (default): ftrun.save/ftrun.load; torch:DIR: torch.save to DIR, torch.load on restart")
    p.add_argument("--save-every", type=int, default=1, help="save every N steps (and after the last)")
    p.add_argument("--overlap-saves", action="store_true",
                   help="ftrun.save(overlap=True): CUDA copies overlap the next forward and backward pass")
    p.add_argument("--timing", action="store_true", help="print TIMING and FIRSTSTEP lines (see above)")
    p.add_argument("--fsdp", type=int, choices=[0, 1, 2], default=0,
                   help="2: FSDP2 fully_shard, 1: FSDP1 with a sharded state dict, 0 (default): data parallel + ZeRO")
    p.add_argument("--meta-init", action="store_true", help="--fsdp 2: built on the meta device; ranks make own shards")
    p.add_argument("--resilient", action="store_true",
                   help="run under @ftrun.resilient: warm recovery in the surviving processes and warm standbys")
    p.add_argument("--raise-at", metavar="RANK:STEP", default=None,
                   help="(tests) that rank raises RuntimeError at that step, in its first generation only")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.checkpoint != "ftrun" and not (a.checkpoint.startswith("torch:") and len(a.checkpoint) > 6):
        p.error(f"--checkpoint must be ftrun or torch:DIR, not '{a.checkpoint}'")
    if a.save_every < 1:
        p.error("--save-every must be at least 1")
    if a.d_model % a.heads:
        p.error(f"--d-model ({a.d_model}) must be a multiple of --heads ({a.heads})")
    if a.resilient and (a.fsdp or a.checkpoint != "ftrun"):
        p.error("--resilient restores through ftrun.restore: --checkpoint ftrun, no --fsdp")
    if (a.fsdp and a.checkpoint != "ftrun") or (a.meta_init and a.fsdp != 2):
        p.error("--fsdp saves through ftrun only (--checkpoint ftrun); --meta-init needs --fsdp 2")
    if min(a.vocab, a.d_model, a.layers, a.heads, a.seq, a.batch) < 1 or a.steps < 0:
        p.error("sizes must be positive")
    return a


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
        h.update(p.detach().cpu().flatten().clone().view(torch.uint8).numpy().tobytes())  # a copy
    return h.hexdigest()


# Timing


def process_start_mono():
    """CLOCK_MONOTONIC time of this process's creation, from /proc/self/stat
    (starttime, in clock ticks since boot); None where /proc lacks it."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat; fields[0] is field 3
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def main(ctx=None):
    """One run of training; ctx: the @ftrun.resilient context (--resilient), else None."""
    a = parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    def timing(name, value):
        if a.timing:
            say(f"TIMING {rank} {name} {value!r}")

    t_begun = _T_IMPORTED  # warm (a process that ran before the failure): this generation began now
    if ctx is not None and (ctx.warm or ctx.standby):
        t_begun = time.monotonic()
    else:
        t_start = process_start_mono()
        if t_start is not None:
            timing("t_start", t_start)
            timing("startup_s", _T_SCRIPT - t_start)
            timing("import_s", _T_IMPORTED - t_start)
    timing("t_imported", t_begun)
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
    timing("process_group_s", time.monotonic() - t_begun)

    # A survivor's model (or a warm standby's, built while it waited) is kept and restored in place.
    if a.fsdp:  # every rank keeps its shard of the model (--meta-init: only ever makes that shard)
        model = sharded_model(a, lambda: prepare_model()["model"], Block, world, device)
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    else:
        model = (ctx.keep("model", lambda: prepare_model()["model"]) if ctx else prepare_model()["model"]).to(device)
        opt = ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=torch.optim.Adam, lr=a.lr)
    params = list(model.parameters())
    torch.manual_seed(a.seed + 1 + rank)  # dropout masks differ between ranks
    if device.type == "cuda":
        torch.cuda.manual_seed(a.seed + 1 + rank)
    if a.checkpoint == "ftrun":
        ckpt = FtrunCheckpoint(overlap=a.overlap_saves)
    else:
        ckpt = TorchCheckpoint(a.checkpoint[len("torch:"):], rank, world)
    t_setup = time.monotonic()
    timing("setup_s", t_setup - t_begun)
    timing("t_setup", t_setup)

    start = 0
    def restored(start):
        t_restored = time.monotonic()
        timing("restore_s", t_restored - t_setup)
        timing("restore_minflt", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt)
        timing("t_restored", t_restored)
        say(f"RESUMED {rank} {start}")
    flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    resumed = ckpt.load(device) if ctx is None else None
    if ctx is not None:  # in place, into the kept model and the new optimizer
        extra = {}
        start = ftrun.restore(model=model, optim=opt.optim, extra=extra)
        if start:
            if extra["step"] != start - 1:
                raise RuntimeError(f"rank {rank}: version {start - 1} holds the state of step {extra['step']}")
            restored(start)
    if resumed is not None:
        step, state = resumed
        t_loaded = time.monotonic()
        if a.fsdp:
            fsdp_restore(model, opt, state)  # this rank's shards only, in place
        else:
            model.load_state_dict(state["model"])
            opt.optim.load_state_dict(state["optim"])  # this rank's shard only
        ftrun.set_rng_state(state["rng"])
        start = step + 1
        if state["step"] != step:
            raise RuntimeError(f"rank {rank}: version {step} holds the state of step {state['step']}")
        del state, resumed
        timing("restore_load_s", t_loaded - t_setup)
        restored(start)
    flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    # Every rank must go on from the same step (the agent restores one version for all).
    lo = torch.tensor([start, -start], dtype=torch.int64, device=device)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    if lo[0].item() != start or -lo[1].item() != start:
        raise RuntimeError(f"rank {rank} resumes at step {start}, others between {lo[0].item()} "
                           f"and {-lo[1].item()}")

    model.train()
    first_step = start > 0
    saved = False
    for step in range(start, a.steps):
        t_step = time.monotonic()
        if a.raise_at == f"{rank}:{step}" and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
            raise RuntimeError(f"rank {rank} raises at step {step} (--raise-at)")
        x, y = batch(a, step, rank, device)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        t_sync = time.monotonic()
        mean_loss = fsdp_mean_loss(loss, world) if a.fsdp else sync_gradients(params, loss, world)
        if rank == 0:
            say(f"LOSS {step} {float(mean_loss).hex()}")
        t_opt = time.monotonic()
        opt.step()
        if a.timing:
            say(f"TIMING {rank} step_s {time.monotonic() - t_step!r} {step}")
        if first_step:  # the first step after a restore is done
            first_step = False
            now = time.monotonic()
            timing("first_step_s", now - t_step)
            timing("first_step_compute_s", t_sync - t_step)  # forward and backward
            timing("first_step_sync_s", t_opt - t_sync)  # gradient all-reduce
            timing("first_step_opt_s", now - t_opt)  # Adam on the shard, parameters broadcast
            timing("first_step_minflt", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt)
            timing("t_first_step", now)
            if a.timing:
                say(f"FIRSTSTEP {rank} {time.time()!r} {now!r}")
        if step % a.save_every == a.save_every - 1 or step == a.steps - 1:
            msd, osd = fsdp_state(model, opt) if a.fsdp else (model.state_dict(), opt.optim.state_dict())
            state = {"model": msd, "optim": osd, "step": step, "rng": ftrun.rng_state()}
            if a.timing and not saved:
                timing("state_bytes", tensor_bytes(state))
            saved = True
            flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.monotonic()
            parts = ckpt.save(step, state)
            stall = time.monotonic() - t0
            if a.fsdp:
                say(saved_line(rank, step, ckpt.last_stats, state))
            parts["save_minflt"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt
            del state
            if a.timing:
                say(f"TIMING {rank} save_stall_s {stall!r} {step}")
                for name, value in parts.items():
                    say(f"TIMING {rank} {name} {value!r} {step}")
        time.sleep(a.step_ms / 1000.0)
        while a.hold_file and os.path.exists(a.hold_file):
            time.sleep(0.02)

    ckpt.finish()
    dist.barrier()
    if a.fsdp:
        say(f"WEIGHTS {rank} {local_digest(local_tensors(model.state_dict()))}")
    else:
        say(f"WEIGHTS {rank} {weights_digest(model)}")
    dist.destroy_process_group()


def prepare_model():  # (no rank: a warm standby calls it before it has one)
    torch.manual_seed(parse_args().seed)  # every rank builds the same initial model
    return {"model": GPT(parse_args())}


if __name__ == "__main__":
    if "--resilient" in sys.argv[1:]:  # warm recovery: main(ctx) runs again in this process after a failure
        ftrun.resilient(main, prepare=prepare_model)()
    else:
        main()
