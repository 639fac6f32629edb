"""train_ddp.py's model and data under a Lightning Trainer (DDPStrategy, CPU,
gloo, torchdata's StatefulDataLoader over a DistributedSampler, gradient
accumulation, a LR schedule), saved through ftrun at every
optimizer step and resumed from it after a restart: the README's Lightning
section, and a rank of tests/integration/test_ddp_exact.py.

    trainer = L.Trainer(..., plugins=[ftrun.lightning.CheckpointIO()], callbacks=[ftrun.lightning.Checkpoint()])
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ftrun.lightning.ckpt_path())

    ftrun --num_nodes 2 --num_gpus 2 integration/examples/train_lightning.py --steps 16
    ftrun --num_nodes 2 --num_gpus 2 integration/examples/train_lightning.py --steps 16 --fsdp

--fsdp: FSDPStrategy in lit-gpt's configuration (every transformer Block its
own FSDP unit with activation checkpointing, limit_all_gathers) and
state_dict_type="sharded": every rank saves only its own shards through
ftrun, nothing is gathered.

--resilient runs it under @ftrun.resilient (warm recovery): after a failure
the surviving processes keep their imports (Lightning's take seconds) and
fit again from the restored version; a dead rank's place goes to a warm
standby that has imported them already. The Trainer, the module and the
loader are built anew in every generation (a kept module would still hold the
aborted generation's Trainer and its DDP).

--checkpoint own:DIR saves through Lightning's own ModelCheckpoint instead
(own_checkpoint.py; run by torchrun, for bench/stack_recovery.py).

Output as train_ddp.py's (LOSS <step> for every micro-batch rank 0 runs: the
last one printed for a step is its last micro-batch's).
"""
import os
import sys
import time

try:
    import ftrun.lightning
except ImportError as e:
    sys.stderr.write(f"train_lightning.py: cannot import ftrun.lightning ({e}); run it under ftrun or ftrun-agent\n")
    sys.exit(2)

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torchdata.stateful_dataloader import StatefulDataLoader

from train_ddp import TiedGPT, parse_args, sequences  # noqa: E402  (beside this script)
from train_gpt import say, weights_digest  # noqa: E402
from lightning_fsdp import full_weights_digest, trainer_fsdp  # noqa: E402


class Sequences(torch.utils.data.Dataset):
    """train_ddp.sequences, one (input, target) pair per item."""

    def __init__(self, a, n):
        self.seq = sequences(n, a.seq + 1, a.vocab, a.seed)

    def __len__(self):
        return len(self.seq)

    def __getitem__(self, i):
        return self.seq[i, :-1], self.seq[i, 1:]


class Module(L.LightningModule):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.net = TiedGPT(a)

    def training_step(self, xy, batch_idx):
        x, y = xy
        loss = F.cross_entropy(self.net(x).flatten(0, 1), y.flatten())
        if self.global_rank == 0:
            say(f"LOSS {self.global_step} {loss.item().hex()}")
        if self.a.step_ms:
            time.sleep(self.a.step_ms / 1000)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=self.a.steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def checkpointing(a):
    """The Trainer's checkpoint options and the checkpoint to resume from: ftrun's (the default), Lightning's
    own (--checkpoint own:DIR: ModelCheckpoint every optimizer step, DIR/last.ckpt), or none."""
    if a.checkpoint == "ftrun":
        return dict(enable_checkpointing=False, plugins=[ftrun.lightning.CheckpointIO()],
                    callbacks=[ftrun.lightning.Checkpoint(overlap=a.overlap, fsdp=a.fsdp_save)]), \
            ftrun.lightning.ckpt_path()
    if a.checkpoint == "none":
        return dict(enable_checkpointing=False), None
    last = os.path.join(a.own_dir, "last.ckpt")
    return dict(callbacks=[ModelCheckpoint(dirpath=a.own_dir, every_n_train_steps=1, save_top_k=0,
                                           save_last=True)]), last if os.path.exists(last) else None


def main(ctx=None):
    """One run; ctx: @ftrun.resilient's context (--resilient), else None."""
    a = parse_args(own=("own",))
    torch.manual_seed(a.seed)
    model = Module(a)
    options, ckpt = checkpointing(a)
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                        num_nodes=int(os.environ["GROUP_WORLD_SIZE"]),
                        strategy=trainer_fsdp() if a.fsdp else
                        DDPStrategy(process_group_backend="gloo", find_unused_parameters=a.find_unused),
                        max_steps=a.steps, accumulate_grad_batches=a.accum, deterministic=True,
                        use_distributed_sampler=False, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, **options)
    # The loader's own DistributedSampler: its order depends on the seed and the epoch only, so the loader's
    # saved position finds the same batches after a restart (Lightning's wrapper around a RandomSampler would
    # draw a new order from the global generator).
    data = Sequences(a, 24 * a.batch * int(os.environ["WORLD_SIZE"]))
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=int(os.environ["WORLD_SIZE"]),
                                                  rank=int(os.environ["RANK"]), shuffle=True, seed=a.seed)
    loader = StatefulDataLoader(data, batch_size=a.batch, sampler=sampler)
    if ckpt is not None:
        say(f"RESUMED {trainer.global_rank} restore")
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt)
    if a.checkpoint == "ftrun":
        ftrun.wait()
    digest = full_weights_digest(trainer.strategy.model, model.net, weights_digest) if a.fsdp else \
        weights_digest(model.net)
    say(f"WEIGHTS {trainer.global_rank} {digest}")


if __name__ == "__main__":
    if "--resilient" in sys.argv[1:]:  # warm recovery: main(ctx) runs again in this process after a failure
        ftrun.resilient(main)()
    else:
        main()
