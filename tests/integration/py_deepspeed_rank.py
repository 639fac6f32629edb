"""A rank of test_deepspeed_engine.py: ftrun.deepspeed.FtrunCheckpointEngine
driven the way DeepSpeed's engine drives a checkpoint engine, by hand
(ds_save_checkpoint / ds_load_checkpoint below repeat the calls of
DeepSpeedEngine.save_checkpoint / load_checkpoint, 0.16 to 0.19, both call
styles; real DeepSpeed runs in py_deepspeed_real.py).

    py_deepspeed_rank.py checks SAVE_DIR               both call styles, placeholders, latest, loads, errors
    py_deepspeed_rank.py train SAVE_DIR STEPS SLEEP    trains, checkpoints every step, resumes via load_checkpoint
    py_deepspeed_rank.py train SAVE_DIR STEPS 0 --no-ftrun   the golden run
"""
import collections
import dataclasses
import glob
import hashlib
import os
import sys
import time
from rank_say import say


@dataclasses.dataclass
class CheckpointCommitInfo:  # deepspeed.runtime.checkpoint_engine.CheckpointCommitInfo (0.17.1+)
    tag: str
    save_dir: str
    save_latest: bool


class LossScaler:  # stands for DeepSpeed's loss scaler object in the ZeRO state
    def __init__(self, scale):
        self.cur_scale = scale

    def __eq__(self, other):
        return isinstance(other, LossScaler) and other.cur_scale == self.cur_scale


class FakeDeepSpeedEngine:
    """The attributes of DeepSpeedEngine that install() and the calls below use."""

    def __init__(self, rank, world, bf16):
        import torch

        self.global_rank, self.dp_world_size, self.bf16 = rank, world, bf16
        torch.manual_seed(42)  # data-parallel replicas start equal
        self.module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-2)
        self.global_steps = 0
        self.checkpoint_engine = None  # TorchCheckpointEngine in DeepSpeed
        self.save_non_zero_checkpoint = rank == 0  # DeepSpeed: data-parallel rank 0 only
        self.save_zero_checkpoint = True
        self._config = {"train_batch_size": 4}

    def step(self, rank):
        import torch

        torch.manual_seed(1000 * rank + self.global_steps)
        x, y = torch.randn(4, 6), torch.randn(4, 3)
        loss = (self.module(x) - y).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.global_steps += 1

    def module_state_dict(self):
        sd = self.module.state_dict()
        if self.bf16:  # the bit16 model DeepSpeed keeps under bf16
            sd = collections.OrderedDict((k, v.bfloat16()) for k, v in sd.items())
        return sd

    def zero_state_dict(self):
        import torch

        flat = torch.cat([p.detach().reshape(-1) for p in self.module.parameters()])
        return {
            "loss_scaler": LossScaler(1.0),
            "dynamic_loss_scale": False,
            "overflow": False,
            "clip_grad": 1.0,
            "base_optimizer_state": self.optimizer.state_dict(),
            "single_partition_of_fp32_groups": [flat],
            "zero_stage": 1,
            "group_paddings": [0],
            "partition_count": [self.dp_world_size],
            "ds_version": "0.17.1",
        }


def ckpt_name(save_dir, tag):
    return os.path.join(save_dir, str(tag), "mp_rank_00_model_states.pt")


def zero_ckpt_name(save_dir, tag, dp_rank, bf16):
    prefix = ("bf16_" if bf16 else "") + f"zero_pp_rank_{dp_rank}"
    return os.path.join(save_dir, str(tag), f"{prefix}_mp_rank_00_optim_states.pt")


_barriers = [0]


def barrier(save_dir, eng, timeout=30):
    """dist.barrier() stand-in: files under save_dir/.barriers, per restart generation."""
    n = _barriers[0]
    _barriers[0] += 1
    d = os.path.join(save_dir, ".barriers", f"g{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}-{n}")
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, str(eng.global_rank)), "w").close()
    deadline = time.time() + timeout
    while len(os.listdir(d)) < eng.dp_world_size:
        if time.time() > deadline:
            rank_fail(eng.global_rank, f"barrier {d} timed out")
        time.sleep(0.005)


def ds_save_checkpoint(eng, save_dir, tag=None, client_state={}, save_latest=True, new_style=True, after_commit=None):
    """The checkpoint-engine calls of DeepSpeedEngine.save_checkpoint (ZeRO 1/2, no MoE)."""
    ce = eng.checkpoint_engine
    if eng.global_rank == 0:
        ce.makedirs(save_dir, exist_ok=True)
    barrier(save_dir, eng)
    if tag is None:
        tag = f"global_step{eng.global_steps}"
    tag = str(tag)
    info = CheckpointCommitInfo(tag=tag, save_dir=save_dir, save_latest=save_latest) if new_style else tag
    ce.create(info)
    ce.makedirs(os.path.dirname(ckpt_name(save_dir, tag)), exist_ok=True)  # _create_checkpoint_file
    state = dict(module=eng.module_state_dict(), buffer_names=[], optimizer=None,
                 param_shapes=[collections.OrderedDict((n, p.shape) for n, p in eng.module.named_parameters())],
                 frozen_param_shapes=None, shared_params={}, frozen_param_fragments=None, lr_scheduler=None,
                 data_sampler=None, random_ltd=None, sparse_tensor_module_names=set(), skipped_steps=0,
                 global_steps=eng.global_steps, global_samples=eng.global_steps * 4,
                 dp_world_size=eng.dp_world_size, mp_world_size=1, ds_config=eng._config, ds_version="0.17.1")
    state.update(client_state)
    if eng.save_non_zero_checkpoint:
        ce.save(state_dict=state, path=ckpt_name(save_dir, tag))
    if eng.save_zero_checkpoint:
        zpath = zero_ckpt_name(save_dir, tag, eng.global_rank, eng.bf16)
        ce.makedirs(os.path.dirname(zpath), exist_ok=True)
        ce.save(dict(optimizer_state_dict=eng.zero_state_dict(), ds_config=eng._config, ds_version="0.17.1"), zpath)
    if new_style:
        if not ce.is_decoupled():
            ce.commit(CheckpointCommitInfo(tag=tag, save_dir=save_dir, save_latest=save_latest))
            if after_commit:
                after_commit(tag)
            if save_latest and eng.global_rank == 0:
                with open(os.path.join(save_dir, "latest"), "w") as fd:
                    fd.write(tag)
    else:
        ce.commit(tag)
        if after_commit:
            after_commit(tag)
        if save_latest and eng.global_rank == 0:
            with open(os.path.join(save_dir, "latest"), "w") as fd:
                fd.write(tag)
    barrier(save_dir, eng)
    return state


def ds_load_checkpoint(eng, load_dir, tag=None):
    """The checkpoint-engine calls of DeepSpeedEngine.load_checkpoint (ZeRO 1/2):
    returns (load_path, model state, zero optimizer state) or (None, None, None)."""
    ce = eng.checkpoint_engine
    if tag is None:
        latest_path = os.path.join(load_dir, "latest")
        if not os.path.isfile(latest_path):
            return None, None, None
        with open(latest_path) as fd:
            tag = fd.read().strip()
    ckpt_list = sorted(glob.glob(os.path.join(load_dir, str(tag), "*mp_rank_*_model_states.pt")))
    if not ckpt_list:
        return None, None, None
    load_path = ckpt_list[0]  # SDLoader: mp_world_size 1
    checkpoint = ce.load(load_path, map_location=lambda storage, loc: storage)
    zero_sd = None
    for bf16_mode in (eng.bf16, not eng.bf16):
        name = zero_ckpt_name(load_dir, tag, eng.global_rank, bf16_mode)
        if os.path.exists(name):
            zero_sd = ce.load(name, map_location="cpu")["optimizer_state_dict"]
            break
    return load_path, checkpoint, zero_sd


def restore(eng, checkpoint, zero_sd):
    import torch

    with torch.no_grad():  # fp32 master weights from the ZeRO partition, as DeepSpeed does
        flat, off = zero_sd["single_partition_of_fp32_groups"][0], 0
        for p in eng.module.parameters():
            p.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
    eng.optimizer.load_state_dict(zero_sd["base_optimizer_state"])
    eng.global_steps = checkpoint["global_steps"]



def rank_fail(rank, what):
    say(f"DSRANK FAILED rank {rank}: {what}")
    sys.exit(1)


def same(a, b, where, rank):
    import torch

    if isinstance(a, torch.Tensor):
        ok = (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
              and torch.equal(a.detach().cpu(), b.detach().cpu()))
        if not ok:
            rank_fail(rank, f"{where}: tensors differ ({a.dtype}{list(a.shape)} vs "
                            f"{getattr(b, 'dtype', type(b))}{list(getattr(b, 'shape', []))})")
    elif isinstance(a, dict):
        if type(a) is not type(b) or list(a) != list(b):
            rank_fail(rank, f"{where}: dict keys/type differ")
        for k in a:
            same(a[k], b[k], f"{where}/{k}", rank)
    elif isinstance(a, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            rank_fail(rank, f"{where}: sequence differs")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}/{i}", rank)
    elif a != b:
        rank_fail(rank, f"{where}: {b!r} != {a!r}")


def rank_checks(save_dir):
    import torch

    import ftrun.deepspeed as fds

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    eng = FakeDeepSpeedEngine(rank, world, bf16=True)
    ce = fds.install(eng)
    if eng.checkpoint_engine is not ce or not eng.save_non_zero_checkpoint:
        rank_fail(rank, "install() sets checkpoint_engine and save_non_zero_checkpoint")
    if not (ce.is_data_parallel_writer(1) and not ce.is_decoupled() and not ce.preserves_storage_sharing()):
        rank_fail(rank, "engine flags")
    for _ in range(2):
        eng.step(rank)
    eng.global_steps = 10

    def latest():
        with open(os.path.join(save_dir, "latest")) as f:
            return f.read()

    # New call style (DeepSpeed >= 0.17.1): the engine writes `latest` itself
    # (checked on rank 0 before the DeepSpeed-style write of rank 0; the
    # engines write atomically, DeepSpeed truncates and writes).
    def check_latest_new(tag):
        if rank == 0 and latest() != tag:
            rank_fail(rank, f"after commit(info) `latest` holds {latest()!r}, want {tag!r}")

    saved = ds_save_checkpoint(eng, save_dir, client_state={"epoch": 3}, after_commit=check_latest_new)
    saved_zero = eng.zero_state_dict()
    tag = "global_step10"
    for path in (ckpt_name(save_dir, tag), zero_ckpt_name(save_dir, tag, rank, True)):
        if not os.path.isfile(path):
            rank_fail(rank, f"no placeholder at {path}")
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read()
        if size > 1024 or not head.startswith(b"ftrun placeholder"):
            rank_fail(rank, f"{path}: not a tiny ftrun placeholder ({size} bytes: {head[:40]!r})")
        rec = fds.read_placeholder(path)
        if rec is None or rec["version"] != 10 or rec["tag"] != tag:
            rank_fail(rank, f"placeholder record {rec}")
    if ce.tag_versions.get(tag) != 10:
        rank_fail(rank, f"tag_versions {ce.tag_versions}")

    load_path, ckpt, zero_sd = ds_load_checkpoint(eng, save_dir)
    if load_path != ckpt_name(save_dir, tag):
        rank_fail(rank, f"load_checkpoint found {load_path}")
    same(saved, ckpt, "model states", rank)
    same(saved_zero, zero_sd, "zero optimizer states", rank)
    if ckpt["module"]["0.weight"].dtype != torch.bfloat16:
        rank_fail(rank, "bf16 module states come back as bfloat16")
    say(f"rank {rank}: new-style tag {tag} saved and loaded back equal")

    # Old call style (DeepSpeed <= 0.16): a plain tag; DeepSpeed writes `latest`.
    for _ in range(2):
        eng.step(rank)
    eng.global_steps = 20

    def check_latest_old(t):
        if rank == 0 and latest() != "global_step10":  # rank 0 writes it only after commit returns
            rank_fail(rank, f"commit(tag) wrote `latest` ({latest()!r}); DeepSpeed <= 0.16 writes it itself")

    saved = ds_save_checkpoint(eng, save_dir, new_style=False, after_commit=check_latest_old)
    saved_zero = eng.zero_state_dict()
    if ce.tag_versions.get("global_step20") != 20:
        rank_fail(rank, f"tag_versions {ce.tag_versions}")
    load_path, ckpt, zero_sd = ds_load_checkpoint(eng, save_dir)
    same(saved, ckpt, "model states (old style)", rank)
    same(saved_zero, zero_sd, "zero optimizer states (old style)", rank)
    say(f"rank {rank}: old-style tag global_step20 saved and loaded back equal")

    # Tags without usable digits take the next version; the placeholders say which.
    ds_save_checkpoint(eng, save_dir, tag="best")
    ds_save_checkpoint(eng, save_dir, tag="global_step5")
    if (ce.tag_versions.get("best"), ce.tag_versions.get("global_step5")) != (21, 22):
        rank_fail(rank, f"tag_versions {ce.tag_versions}")
    if fds.read_placeholder(ckpt_name(save_dir, "global_step5"))["version"] != 22:
        rank_fail(rank, "placeholder of global_step5 names version 22")

    # A fresh engine (a restarted process) finds everything through the files.
    ce2 = fds.FtrunCheckpointEngine()
    eng.checkpoint_engine = ce2
    _, ckpt, zero_sd = ds_load_checkpoint(eng, save_dir)
    same(saved, ckpt, "state through a fresh engine", rank)
    same(saved_zero, zero_sd, "zero state through a fresh engine", rank)

    # Errors: a file this rank never saved, an old tag the agent let go.
    def expect_missing(fn, needle):
        try:
            fn()
        except FileNotFoundError as e:
            if needle not in str(e):
                rank_fail(rank, f"FileNotFoundError without {needle!r}: {e}")
            return
        rank_fail(rank, f"no FileNotFoundError ({needle})")

    other = zero_ckpt_name(save_dir, "global_step5", rank + 7, True)
    expect_missing(lambda: ce2.load(other), "no state for")
    expect_missing(lambda: ce2.load(ckpt_name(save_dir, "global_step10")), "does not hold")
    expect_missing(lambda: ce2.load(os.path.join(save_dir, "nosuchtag", "x.pt")), "no checkpoint file")

    # A real torch file (an ordinary checkpoint on disk) is loaded with torch.load.
    real = os.path.join(save_dir, f"real_rank{rank}", "mp_rank_00_model_states.pt")
    os.makedirs(os.path.dirname(real), exist_ok=True)
    torch.save({"module": eng.module.state_dict()}, real)
    same({"module": eng.module.state_dict()}, ce2.load(real, map_location="cpu"), "torch file fallback", rank)
    ce2.cleanup()
    say(f"DSRANK OK {rank}")


def rank_train(save_dir, steps, sleep, use_ftrun):
    import torch

    torch.set_num_threads(1)
    _barriers[0] = 0  # the barriers are the generation's, as a process group's are
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    eng = FakeDeepSpeedEngine(rank, world, bf16=False)
    if use_ftrun:
        import ftrun.deepspeed

        ftrun.deepspeed.install(eng)
        load_path, ckpt, zero_sd = ds_load_checkpoint(eng, save_dir)
        if load_path is not None:
            restore(eng, ckpt, zero_sd)
            say(f"RESUMED {rank} at step {eng.global_steps} from {os.path.relpath(load_path, save_dir)}")
    while eng.global_steps < steps:
        eng.step(rank)
        if use_ftrun:
            ds_save_checkpoint(eng, save_dir)
            time.sleep(sleep)
    h = hashlib.md5()
    for t in eng.module.state_dict().values():
        h.update(t.numpy().tobytes())
    for s in eng.optimizer.state_dict()["state"].values():
        h.update(s["exp_avg"].numpy().tobytes() + s["exp_avg_sq"].numpy().tobytes())
    say(f"DIGEST {rank} {h.hexdigest()}")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 2 else None
    if mode == "checks":
        rank_checks(sys.argv[2])
    elif mode == "train" and "--resilient" in sys.argv:  # the engine made anew in every generation
        import ftrun

        ftrun.resilient(lambda ctx: rank_train(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), True))()
    elif mode == "train":
        rank_train(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), "--no-ftrun" not in sys.argv)
    else:
        rank_fail(-1, f"unknown mode {mode}")
