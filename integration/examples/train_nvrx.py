"""train_ddp.py's job under NVIDIA's resiliency extension (nvidia-resiliency-ext 0.4.1, NVRx) instead of ftrun:
a peer for bench/stack_recovery.py to measure ftrun against. Not an ftrun example: nothing of ftrun runs here.

It is set up the way NVRx's DDP heartbeat example is. NVRx's launcher, ft_launcher (derived from torchrun),
starts the ranks with a rank monitor beside each. When a rank dies, it stops the others and starts all of
them again (--max-restarts, the any-failed policy). Every rank sends its monitor a heartbeat each step
(fault_tolerance.RankMonitorClient), so a hung rank is killed, and the job restarted, after
--ft-rank-heartbeat-timeout. After every step, rank 0 saves nanoGPT's checkpoint (model, optimizer, step)
with NVRx's asynchronous checkpointing: a copy of the state goes to the persistent background process of
checkpointing.async_ckpt's AsyncCallsQueue, which torch.saves it to DIR/ckpt.pt (under a temporary name,
then renamed). Only one save is in flight at a time. The restarted ranks resume from this file.
(--checkpoint also takes none and own_checkpoint.py's kinds.)

    ft_launcher --standalone --nproc-per-node 4 --max-restarts 3 --ft-enable-nic-monitor false \\
        --ft-initial-rank-heartbeat-timeout 120 --ft-rank-heartbeat-timeout 60 \\
        integration/examples/train_nvrx.py --steps 30 --checkpoint nvrx:/tmp/nvrx-ckpt

(ft_launcher is `python -m nvidia_resiliency_ext.fault_tolerance.launcher`.) --inprocess adds NVRx's
in-process restart (inprocess.Wrapper, set up as its in_job_and_in_process example). After a failure, the
processes still alive run the training again: renumbered without the dead ones, on a new gloo group, from
the checkpoint. This needs --ft-restart-policy min-healthy, under which a launcher that lost a rank counts
as failed. So the job continues (one rank fewer) instead of restarting everything only when there is one
launcher per node and --nnodes 1:N.

Output is the same as train_ddp.py's (LOSS, RESUMED, WEIGHTS), plus `STARTED <rank>` when a process begins.

What does not run with CPU-only torch (2.13, gloo): TorchAsyncCheckpoint (NVRx's torch.save wrapper),
synchronized finalization (maybe_finalize_async_calls(no_dist=False)), the non-persistent queue and
FileSystemWriterAsync's preload step all call torch.cuda ("AssertionError: Torch not compiled with CUDA
enabled"). That is why this script uses AsyncCallsQueue with torch.save and no_dist=True. Local
checkpointing requires CUDA tensors (BasicTensorAwareStateDict: `assert state_dict_value.is_cuda`), and
its asynchronous save calls torch.cuda.synchronize. Gloo collectives cannot be aborted (one of NVRx's
known issues; pytorch/pytorch#130345), so an in-process restart waits out GLOO_TIMEOUT.
"""
import contextlib
import copy
import datetime
import logging
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from nvidia_resiliency_ext import fault_tolerance
from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue, AsyncRequest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import own_checkpoint  # noqa: E402  (beside this script)
from train_ddp import new_model, parse_args, train  # noqa: E402
from train_gpt import say  # noqa: E402

# --inprocess: the survivors of a failure wait this long in their gloo collective (NVRx's CPU examples' value).
GLOO_TIMEOUT = datetime.timedelta(seconds=10)


def write(state, path):
    """Runs in NVRx's background process: torch.save under a temporary name, then renamed into place."""
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


class NvrxCheckpoint(own_checkpoint.NanoGPTCheckpoint):
    """nanoGPT's checkpoint that rank 0 saves through NVRx's AsyncCallsQueue. Every rank loads it."""

    def __init__(self, directory):
        super().__init__(directory, None)
        self.queue = None  # rank 0's, made in load()
        self.atomic = contextlib.nullcontext  # --inprocess: the Wrapper's atomic(), so a restart does not cut a save

    def load(self, raw, optimizer):
        self._wait()  # (after an in-process restart: this process's last save)
        if dist.get_rank() == 0 and self.queue is None:  # its background process starts beside the resume
            self.queue = AsyncCallsQueue()
            self.queue.schedule_async_request(AsyncRequest(os.makedirs, (os.path.dirname(self.path),), [],
                                                           {"exist_ok": True}))
        return super().load(raw, optimizer)

    def save(self, step, raw, optimizer):
        if dist.get_rank() != 0:
            return
        # A copy: on CPU, NVRx's staging (preload_tensors) does not copy, and the next step changes the tensors.
        state = copy.deepcopy({"model": raw.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": step})
        with self.atomic():
            self._wait()
            self.queue.schedule_async_request(AsyncRequest(write, (state, self.path), []))

    def _wait(self):
        if self.queue is not None:  # no_dist=True: no_dist=False synchronizes the ranks through a CUDA tensor
            self.queue.maybe_finalize_async_calls(blocking=True, no_dist=True)

    def finish(self):
        self._wait()

    def close(self):
        """Ends the background process."""
        self._wait()
        if self.queue is not None:
            self.queue.close()


def run(a, ck, client, store=None):
    """This process's training (again after each in-process restart): train_ddp.py's, with a heartbeat each step."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if store is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=GLOO_TIMEOUT)
    if client.is_initialized:  # (re)connects to this rank's monitor
        client.shutdown_workload_monitoring()
    client.init_workload_monitoring()
    torch.use_deterministic_algorithms(True)
    raw = new_model(a)
    optimizer = torch.optim.AdamW(raw.parameters(), lr=3e-3, weight_decay=0.1)
    torch.manual_seed(a.seed + 1 + rank)  # dropout: each rank its own stream
    own = ck or (own_checkpoint.for_ddp(a.own_kind, a.own_dir, rank) if a.own_dir else None)
    step = own.load(raw, optimizer) if own is not None else None
    if step is not None:
        say(f"RESUMED {rank} {step}")
    model = DDP(raw, find_unused_parameters=a.find_unused, static_graph=a.static_graph)

    def micro_step(x, y, last):
        model.require_backward_grad_sync = last  # nanoGPT's no_sync
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / a.accum
        loss.backward()
        if last:
            client.send_heartbeat()
        return loss

    train(a, rank, raw, optimizer, 0 if step is None else step + 1, micro_step, own=own)
    dist.destroy_process_group()


def main():
    inproc = "--inprocess" in sys.argv[1:]
    a = parse_args([x for x in sys.argv[1:] if x != "--inprocess"], own=("nvrx",) + own_checkpoint.KINDS)
    if a.checkpoint == "ftrun":
        sys.exit("train_nvrx.py: --checkpoint nvrx:DIR, none, or one of own_checkpoint.py's KIND:DIR")
    say(f"STARTED {os.environ['RANK']}")
    ck = NvrxCheckpoint(a.own_dir) if a.own_kind == "nvrx" else None
    client = fault_tolerance.RankMonitorClient()
    try:
        if not inproc:
            return run(a, ck, client)
        from nvidia_resiliency_ext import inprocess

        logging.basicConfig(level=logging.WARNING)  # the Wrapper logs through it (else: "logs are disabled")
        # NVRx's example's ports: its Wrapper's store on MASTER_PORT + 2, one for the gloo groups on + 1.
        port = int(os.environ["MASTER_PORT"])
        base = dist.TCPStore(os.environ["MASTER_ADDR"], port + 1, int(os.environ["WORLD_SIZE"]),
                             is_master=os.environ["RANK"] == "0", multi_tenant=True, use_libuv=True)

        @inprocess.Wrapper(store_kwargs={"port": port + 2})
        def restartable(call_wrapper: inprocess.CallWrapper = None):
            if ck is not None:
                ck.atomic = call_wrapper.atomic
            run(a, ck, client, dist.PrefixStore(str(call_wrapper.iteration), base))

        restartable()
    finally:
        if ck is not None:
            ck.close()
        if client.is_initialized:
            client.shutdown_workload_monitoring()


if __name__ == "__main__":
    main()
