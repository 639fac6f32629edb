"""A Hugging Face accelerate training loop under ftrun: train_ddp.py's GPT
(tied weights, dropout) prepared by an Accelerator (DDP over gloo on the
CPU), a shuffled dataset through accelerate's stateful dataloader,
accelerator.accumulate over 2 micro-batches, AdamW, a linear schedule. ftrun's
two lines stand where the loop would call accelerator.load_state and
accelerator.save_state (the README's Hugging Face section; a rank of
tests/integration/test_ddp_exact.py):

    step = ftrun.accelerate.load_state(accelerator)
    ftrun.accelerate.save_state(accelerator, step)

    ftrun --num_nodes 2 --num_gpus 2 integration/examples/train_accelerate.py --steps 16

Output as train_ddp.py's: rank 0 prints `LOSS <step> <its last micro-batch's
loss, float.hex()>`, every rank `RESUMED <rank> <step>` after a restore and
`WEIGHTS <rank> <sha256 of every parameter's bytes>` at the end.
"""
import sys
import time

try:
    import ftrun.accelerate
except ImportError as e:
    sys.stderr.write(f"train_accelerate.py: cannot import ftrun.accelerate ({e}); run it under ftrun\n")
    sys.exit(2)

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration

from train_ddp import TiedGPT, parse_args, sequences  # noqa: E402  (beside this script)
from train_gpt import say, weights_digest  # noqa: E402


def main():
    a = parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=a.accum,
                              dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    rank = accelerator.process_index
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(a.seed)
    raw = TiedGPT(a)
    optimizer = torch.optim.AdamW(raw.parameters(), lr=3e-3, weight_decay=0.1)
    data = sequences(96, a.seq + 1, a.vocab, a.seed)  # 96 / 4 ranks / 8 = 3 batches per epoch and rank
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=True,
                                         generator=torch.Generator().manual_seed(a.seed))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / (4 * a.steps)))
    model, optimizer, loader, scheduler = accelerator.prepare(raw, optimizer, loader, scheduler)
    torch.manual_seed(a.seed + 1 + rank)  # dropout: each rank its own stream

    step = ftrun.accelerate.load_state(accelerator)  # instead of accelerator.load_state(dir)
    if step is not None:
        say(f"RESUMED {rank} {step}")
    step = -1 if step is None else step
    while step + 1 < a.steps:
        for seq in loader:  # (a restored stateful loader goes on mid-epoch)
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(seq[:, :-1]).flatten(0, 1), seq[:, 1:].flatten())
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            if not accelerator.sync_gradients:
                continue
            step += 1
            if rank == 0:
                say(f"LOSS {step} {loss.item().hex()}")
            ftrun.accelerate.save_state(accelerator, step)  # instead of accelerator.save_state(dir)
            if a.step_ms:
                time.sleep(a.step_ms / 1000)
            if step + 1 >= a.steps:
                break
    ftrun.wait()
    say(f"WEIGHTS {rank} {weights_digest(raw)}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
