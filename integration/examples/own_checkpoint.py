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
  newest as DIR/last.ckpt; with --fsdp a directory of shards) and
  `trainer.fit(ckpt_path=...)` from it.
* train_hf.py: the Trainer's own (`save_steps=1` into DIR/checkpoint-<step>,
  `resume_from_checkpoint` from the newest).
"""
import os

import torch


def parse(p, a):
    """Checks a.checkpoint (ftrun, none or own:DIR); a.own_dir: DIR or None."""
    if a.checkpoint not in ("ftrun", "none") and not (a.checkpoint.startswith("own:") and len(a.checkpoint) > 4):
        p.error(f"--checkpoint must be ftrun, none or own:DIR, not '{a.checkpoint}'")
    a.own_dir = a.checkpoint[4:] if a.checkpoint.startswith("own:") else None
    if a.own_dir:
        os.makedirs(a.own_dir, exist_ok=True)


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
