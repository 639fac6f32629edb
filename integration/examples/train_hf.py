"""A Hugging Face transformers Trainer under ftrun: a small GPT-2 built from a
config (nothing downloaded), a synthetic dataset, data-parallel over the
ranks (DDP through accelerate, gloo on the CPU), dropout, gradient
accumulation, a linear schedule; two lines of ftrun (the README's Hugging
Face section; a rank of tests/integration/test_ddp_exact.py):

    trainer = Trainer(..., callbacks=[ftrun.huggingface.Checkpoint()])
    trainer.train(resume_from_checkpoint=ftrun.huggingface.resume_from_checkpoint())

    ftrun --num_nodes 2 --num_gpus 2 integration/examples/train_hf.py --steps 16

--resilient runs it under @ftrun.resilient (warm recovery): after a failure
the surviving processes keep their imports and train again from the restored
version; a dead rank's place goes to a warm standby that has imported them
already. The model, the arguments and the Trainer are built anew in every
generation (ftrun resets accelerate's process-wide state between them).

--checkpoint own:DIR saves through the Trainer's own checkpoints instead
(own_checkpoint.py; run by torchrun, for bench/stack_recovery.py).

Output: rank 0 prints `LOSS <step> <the logged loss>` for every step it
runs, every rank `RESUMED <rank> <step>` after a restore and `WEIGHTS <rank>
<sha256 of every parameter's bytes>` at the end.
"""
import argparse
import os
import re
import sys
import tempfile
import time

try:
    import ftrun.huggingface
except ImportError as e:
    sys.stderr.write(f"train_hf.py: cannot import ftrun.huggingface ({e}); run it under ftrun or ftrun-agent\n")
    sys.exit(2)

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import own_checkpoint  # noqa: E402  (beside this script)
from train_ddp import sequences  # noqa: E402
from train_gpt import say, weights_digest  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    """train_ddp.sequences, each its own labels."""

    def __init__(self, n, seq, vocab, seed):
        self.ids = sequences(n, seq, vocab, seed)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Report(TrainerCallback):
    def __init__(self, step_ms):
        self.step_ms = step_ms

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            say(f"LOSS {state.global_step - 1} {float(logs['loss']).hex()}")

    def on_step_end(self, args, state, control, **kwargs):
        if self.step_ms:
            time.sleep(self.step_ms / 1000)


def newest_complete_checkpoint(directory):
    """The newest checkpoint-<step> the Trainer finished writing (its trainer_state.json is there; the Trainer
    writes it after the weights and the optimizer). transformers' get_last_checkpoint takes the newest
    directory whatever it holds: after a kill that landed during a save, every restart fails on it
    (FileNotFoundError for its trainer_state.json) until someone removes it."""
    done = [d for d in os.listdir(directory) if re.fullmatch(r"checkpoint-\d+", d)
            and os.path.exists(os.path.join(directory, d, "trainer_state.json"))]
    return os.path.join(directory, max(done, key=lambda d: int(d.split("-")[1]))) if done else None


def main(ctx=None):
    """One run; ctx: @ftrun.resilient's context (--resilient), else None."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-ms", type=float, default=0)
    p.add_argument("--checkpoint", default="ftrun", metavar="ftrun|none|own:DIR",
                   help="ftrun (the default), nothing, or the Trainer's own checkpoint in DIR (save_steps=1), run "
                   "by torchrun (own_checkpoint.py; bench/stack_recovery.py)")
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--resilient", action="store_true",
                   help="run under @ftrun.resilient: warm recovery in the surviving processes")
    p.add_argument("--overlap", action="store_true", help="ftrun.huggingface.Checkpoint(overlap=True): the copy "
                   "into the store runs beside the next step's forward and backward passes")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    own_checkpoint.parse(p, a)
    if a.resilient and a.checkpoint != "ftrun":
        p.error("--resilient restores through ftrun: --checkpoint ftrun")
    rank = int(os.environ["RANK"])
    torch.manual_seed(a.seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.d_model, n_layer=a.layers,
                                       n_head=4))
    save = dict(save_strategy="steps", save_steps=1, save_total_limit=2) if a.own_dir else dict(save_strategy="no")
    args = TrainingArguments(output_dir=a.own_dir or tempfile.mkdtemp(prefix="ftrun-hf-out-"), max_steps=a.steps,
                             per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=3e-3,
                             lr_scheduler_type="linear", logging_steps=1, report_to=[],
                             use_cpu=True, ddp_backend="gloo", seed=a.seed, dataloader_num_workers=0,
                             disable_tqdm=True, full_determinism=True, **save)
    saving = [ftrun.huggingface.Checkpoint(overlap=a.overlap)] if a.checkpoint == "ftrun" else []
    callbacks = saving + [Report(a.step_ms)]
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(512, a.seq, a.vocab, a.seed), callbacks=callbacks)
    if a.checkpoint == "ftrun":
        resume = ftrun.huggingface.resume_from_checkpoint()
        step = resume and resume.rsplit("ftrun-trainer-", 1)[1].split("-")[0]
    else:
        resume = newest_complete_checkpoint(a.own_dir) if a.own_dir else None
        step = resume and resume.rsplit("checkpoint-", 1)[1]  # (its global_step, as ftrun's name has)
    if resume is not None:
        say(f"RESUMED {rank} {step}")
    trainer.train(resume_from_checkpoint=resume)
    if a.checkpoint == "ftrun":
        ftrun.wait()
    say(f"WEIGHTS {rank} {weights_digest(model)}")


if __name__ == "__main__":
    if "--resilient" in sys.argv[1:]:  # warm recovery: main(ctx) runs again in this process after a failure
        ftrun.resilient(main)()
    else:
        main()
