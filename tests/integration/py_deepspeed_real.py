"""A rank of test_deepspeed_real.py: real DeepSpeed (the pinned 0.19.8, CPU
accelerator, gloo) training a small model with ZeRO stage 0-3, fp32 or bf16.

    py_deepspeed_real.py STAGE DTYPE SAVE_DIR STEPS [--plain] [--save-at K] [--resume-from DIR] [--step-ms MS]

Under ftrun (default): ftrun.deepspeed.install(engine), a checkpoint every
step through engine.save_checkpoint(SAVE_DIR); at start, a SAVE_DIR with a
`latest` file is resumed through engine.load_checkpoint (out of the agent's
RAM), else --resume-from DIR is loaded (a plain DeepSpeed checkpoint
directory on disk).

--plain: no ftrun at all (the ranks started by hand or by DeepSpeed's own
launcher); DeepSpeed's own engine writes SAVE_DIR once, after step K
(--save-at), so a later run can resume from it.

Each rank prints `LOSS <step> <rank> <float.hex>` per step and, at the end,
`DIGEST <rank> <md5>` of the full model parameters (gathered under ZeRO-3) and
of this rank's optimizer state (its fp32 master partition and Adam moments).
Data depends only on (step, rank), so a resumed run must end bit-identical.
"""
import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from rank_say import say  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("stage", type=int, choices=[0, 1, 2, 3])
    p.add_argument("dtype", choices=["fp32", "bf16"])
    p.add_argument("save_dir")
    p.add_argument("steps", type=int)
    p.add_argument("--plain", action="store_true")
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--resume-from")
    p.add_argument("--step-ms", type=float, default=0)
    p.add_argument("--local_rank", type=int, default=0)  # DeepSpeed's and ftrun's launchers append it
    return p.parse_args()


def model():
    torch.manual_seed(1234)  # every rank builds the same initial weights
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 8))


def config(stage, dtype):
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 4096, "allgather_bucket_size": 4096},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": dtype == "bf16"},
        "gradient_clipping": 1.0,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def batch(step, rank, dtype):
    g = torch.Generator().manual_seed(100003 * step + rank)
    x, y = torch.randn(4, 32, generator=g), torch.randn(4, 8, generator=g)
    return (x.bfloat16(), y.bfloat16()) if dtype == "bf16" else (x, y)


def _hash_state(h, obj, path=""):
    """Feeds every tensor (name, dtype, shape, bytes) and plain scalar of a nested state into h."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"{path}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            _hash_state(h, obj[k], f"{path}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _hash_state(h, v, f"{path}/{i}")
    elif isinstance(obj, (int, float, str, bool)) or obj is None:
        h.update(f"{path}={obj!r}".encode())


def digest(engine, stage):
    h = hashlib.md5()
    params = list(engine.module.parameters())
    if stage == 3:
        with deepspeed.zero.GatheredParameters(params):
            for i, p in enumerate(params):
                _hash_state(h, p.data, f"param{i}")
    else:
        for i, p in enumerate(params):
            _hash_state(h, p.data, f"param{i}")
    _hash_state(h, engine.optimizer.state_dict(), "optimizer")
    return h.hexdigest()


def main():
    a = parse()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=opt, config=config(a.stage, a.dtype))
    if not a.plain:
        import ftrun.deepspeed

        ftrun.deepspeed.install(engine)
        source = a.save_dir if os.path.exists(os.path.join(a.save_dir, "latest")) else a.resume_from
        if source:
            path, _ = engine.load_checkpoint(source)
            say(f"RESUMED {rank} {engine.global_steps} from {path}")
    elif a.resume_from:
        engine.load_checkpoint(a.resume_from)
    for step in range(engine.global_steps, a.steps):
        x, y = batch(step, rank, a.dtype)
        loss = (engine(x).float() - y.float()).pow(2).mean()
        engine.backward(loss)
        engine.step()
        say(f"LOSS {step} {rank} {loss.item().hex()}")
        if a.step_ms:
            time.sleep(a.step_ms / 1000.0)
        if not a.plain:
            engine.save_checkpoint(a.save_dir, tag=f"global_step{engine.global_steps}")
        elif engine.global_steps == a.save_at:
            engine.save_checkpoint(a.save_dir, tag=f"global_step{engine.global_steps}")
    say(f"DIGEST {rank} {digest(engine, a.stage)}")
    # The end, once every rank is here: the interpreter's teardown is skipped.
    # Tearing down gloo's pairs and DeepSpeed's shared-memory collectives,
    # even after destroy_process_group, now and then std::terminates a rank
    # (exit -6, "terminate called without an active exception", seen in CI on
    # a golden run whose digests were already printed). Every save is
    # committed by then (ftrun.deepspeed's commit is synchronous).
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
