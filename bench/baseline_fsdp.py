"""Benchmark "baseline-fsdp" (issue 19): an FSDP2 model saved every step by
(a) a full state dict gathered on rank 0 and torch.save'd ("full"), (b)
torch.distributed.checkpoint's dcp.save to local disk ("dcp"), (b') its
dcp.async_save ("dcp_async": the stall is what blocks training, staging and
the wait for the previous save's future), (c) ftrun.save
of the sharded state dict ("ftrun"), (c') ftrun.save(overlap=True)
("ftrun_overlap": the copy runs behind the next forward and backward pass;
the stall is the save call plus the wait for the copy at the next optimizer
step, ftrun.save_behind), and (d) no save at all ("none": the
training steps' own memory); the save stall of each, and the peak CPU
memory (VmHWM) of rank 0 and of the other ranks during the saves.

    PYTHONPATH=build/python FTRUN_PYTHON=/path/to/python \
        python bench/baseline_fsdp.py --build build [--mib-per-rank 256] [--steps 4]

The driver starts one job per method under the ftrun runner (2 local nodes x
2 ranks, gloo on CPU processes; `--nodes`, `--per-node` change it), each rank
running this file with `--rank-mode METHOD`. A rank builds a stack of square
Linear layers sized so that parameters + Adam state are `--mib-per-rank` MiB
per rank, wraps each layer and the root with FSDP2 fully_shard, and per step
runs a tiny forward/backward and Adam step, then saves. Each rank prints
`BENCH <method> <rank> <median stall s> <max stall s> <VmHWM before the first
save, KiB> <VmHWM at the end, KiB> <state bytes of the rank>`; the driver prints
`key=value` lines:

  state_mib_per_rank, world, steps
  stall_s_<method>               median over steps and ranks of the per-save stall (slowest rank each step)
  peak_mib_rank0_<method>        rank 0's VmHWM at the end (MiB)
  peak_mib_other_max_<method>    the largest VmHWM of the other ranks
  save_peak_growth_mib_rank0_<method>   VmHWM growth during the saves, rank 0
  save_peak_growth_mib_other_max_<method>
  stall_ratio_dcp_over_ftrun, stall_ratio_full_over_ftrun
  rank0_over_other_peak_<method> rank 0's peak / the others' largest
  save_peak_growth_over_shard_max_<method>  the largest VmHWM growth of a rank during the
                                 saves / one rank's shard of the state (params + Adam)
  save_private_growth_mib_max_<method>   the largest growth of a rank's private memory
                                 (RssAnon, sampled every 10 ms) during the saves; and
                                 _over_shard_: that / one rank's shard
  save_shared_growth_mib_max_<method>    the same for shared memory (RssShmem): for ftrun,
                                 the pages of the node's store the rank maps (the agent's
                                 RAM, where the versions live: counted once per node, not
                                 per rank, but VmHWM counts them in every process)

Targets of the issue: stall_ratio_dcp_over_ftrun >= 10 and
rank0_over_other_peak_ftrun <= ~1. Not measured here: kill -> first step
after restore (tests/torch2/test_fsdp.py covers the restore's correctness).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

METHODS = ("none", "full", "dcp", "dcp_async", "ftrun", "ftrun_overlap")


def _status_kib(*fields):
    out = dict.fromkeys(fields, -1)
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in out:
                out[key] = int(line.split()[1])
    return out


def vm_hwm_kib():
    return _status_kib("VmHWM")["VmHWM"]


class _MemoryPeaks:
    """Samples the process's private memory (RssAnon: gathers, copies, staging)
    and its shared memory (RssShmem: ftrun's store, mapped from the agent)
    every 10 ms from the first save on; VmHWM alone adds both up. The
    training steps' own memory (gradients, FSDP's all-gathers) is in it too:
    method "none" (no save) measures that part alone."""

    def __init__(self):
        import threading

        base = _status_kib("RssAnon", "RssShmem")
        self.anon0, self.shmem0 = base["RssAnon"], base["RssShmem"]
        self.anon, self.shmem = self.anon0, self.shmem0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.01):
            now = _status_kib("RssAnon", "RssShmem")
            self.anon, self.shmem = max(self.anon, now["RssAnon"]), max(self.shmem, now["RssShmem"])

    def stop(self):
        self._stop.set()
        self._thread.join()
        return f"{self.anon0} {self.anon} {self.shmem0} {self.shmem}"


def rank_main(a):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    # params + exp_avg + exp_avg_sq = 3 x params, sharded over the world.
    total_floats = a.mib_per_rank * (1 << 20) * world // (3 * 4)
    layers = max(1, a.layers)
    d = max(world, int((total_floats / layers) ** 0.5) // world * world)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(layers)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(2, d)
    if a.rank_mode.startswith("ftrun"):
        import ftrun
        from ftrun import save_behind
    if a.rank_mode.startswith("dcp"):
        import torch.distributed.checkpoint as dcp
    # async_save's background collectives need their own group: on the default one they would interleave
    # with FSDP's all-gathers of the next step (gloo: "collective mismatch").
    async_group = dist.new_group(backend="gloo") if a.rank_mode == "dcp_async" else None
    pending = None  # dcp_async: the previous save's future, waited for before the next save (DCP's pattern)
    stalls = []
    hwm0 = None
    state_bytes = 0
    state_dict_s = []
    copy_wait_s = []  # ftrun_overlap: the part of each stall spent waiting for the copy at the next step
    for step in range(a.steps):
        model(x).sum().backward()
        waited = save_behind.blocked_seconds() if a.rank_mode == "ftrun_overlap" else 0
        opt.step()  # (ftrun_overlap: waits here for the last save's copy; counted in that save's stall)
        if a.rank_mode == "ftrun_overlap" and stalls:
            copy_wait_s.append(save_behind.blocked_seconds() - waited)
            stalls[-1] += copy_wait_s[-1]
        opt.zero_grad()
        if hwm0 is None:
            hwm0 = vm_hwm_kib()
            peaks = _MemoryPeaks()
        dist.barrier()
        t0 = time.monotonic()
        if a.rank_mode == "none":
            pass
        elif a.rank_mode == "full":
            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            msd, osd = get_state_dict(model, opt, options=opts)
            if rank == 0:
                path = os.path.join(a.dir, "full.pt")
                with open(path + ".tmp", "wb") as f:
                    torch.save({"model": msd, "optim": osd}, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(path + ".tmp", path)
            del msd, osd
        else:
            msd, osd = get_state_dict(model, opt)
            state_dict_s.append(time.monotonic() - t0)
            state = {"model": msd, "optim": osd}
            if a.rank_mode == "dcp":
                dcp.save(state, checkpoint_id=os.path.join(a.dir, f"step{step}"))
            elif a.rank_mode == "dcp_async":
                if pending is not None:
                    pending.result()
                pending = dcp.async_save(state, checkpoint_id=os.path.join(a.dir, f"step{step}"),
                                         process_group=async_group)
            else:
                ftrun.save(step, state, overlap=a.rank_mode == "ftrun_overlap")
            if not state_bytes:
                from ftrun.sharded import _local_of

                def nbytes(o):
                    if isinstance(o, torch.Tensor):
                        return sum(t.numel() * t.element_size() for t in _local_of(o))
                    if isinstance(o, dict):
                        return sum(nbytes(v) for v in o.values())
                    if isinstance(o, (list, tuple)):
                        return sum(nbytes(v) for v in o)
                    return 0
                state_bytes = nbytes(state)
            del state, msd, osd
        stalls.append(time.monotonic() - t0)
        if a.rank_mode == "dcp" and rank == 0 and step > 0:
            shutil.rmtree(os.path.join(a.dir, f"step{step - 1}"), ignore_errors=True)
    if pending is not None:
        pending.result()
    if a.rank_mode.startswith("ftrun"):
        ftrun.wait()  # (the last save's copy, after training: not a stall, as dcp_async's last future)
    dist.barrier()
    for part, times in (("state_dict", state_dict_s), ("copy_wait", copy_wait_s)):
        if times:  # a part of the stall: `PART <method> <rank> <part> <median s>`
            os.write(1, f"PART {a.rank_mode} {rank} {part} {statistics.median(times)!r}\n".encode())
    os.write(1, (f"BENCH {a.rank_mode} {rank} {statistics.median(stalls)!r} {max(stalls)!r} {hwm0} "
                 f"{vm_hwm_kib()} {state_bytes} {peaks.stop()} {' '.join(repr(s) for s in stalls)}\n").encode())
    dist.destroy_process_group()


def run_method(a, method, workdir):
    here = os.path.abspath(__file__)
    run = tempfile.mkdtemp(prefix=f"fsdp-{method}-", dir=workdir)
    cfg = os.path.join(run, "ftrun.yaml")
    with open(cfg, "w") as f:
        # (hang_timeout: the baselines never call ftrun, so the agent sees no progress from them)
        f.write(f"agent:\n  run_dir: {run}/run\njob:\n  max_restarts: 0\n  hang_timeout: 3600s\n"
                f"store:\n  memory_budget: {a.store_mib}MiB\n")
    argv = [os.path.join(a.build, "ftrun"), "--num_nodes", str(a.nodes), "--num_gpus", str(a.per_node),
            "--config", cfg, "--master_addr", "127.0.0.1", "--master_port", str(a.port),
            here, "--rank-mode", method, "--dir", run, "--mib-per-rank", str(a.mib_per_rank),
            "--steps", str(a.steps), "--layers", str(a.layers)]
    env = os.environ.copy()
    pypath = os.path.join(os.path.abspath(a.build), "python")
    env["PYTHONPATH"] = pypath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("FTRUN_PYTHON", sys.executable)
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=a.timeout)
    out = p.stdout + p.stderr
    rows = {}
    parts = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 5 and f[0] == "PART" and f[1] == method:
            parts.setdefault(f[3], []).append(float(f[4]))
        if len(f) >= 8 and f[0] == "BENCH" and f[1] == method:
            rows[int(f[2])] = {"median": float(f[3]), "max": float(f[4]), "hwm0": int(f[5]), "hwm": int(f[6]),
                               "bytes": int(f[7]), "anon0": int(f[8]), "anon": int(f[9]), "shmem0": int(f[10]),
                               "shmem": int(f[11]), "stalls": [float(x) for x in f[12:]]}
    shutil.rmtree(run, ignore_errors=True)
    if p.returncode != 0 or len(rows) != a.nodes * a.per_node:
        sys.stderr.write(f"baseline-fsdp: method {method}: exit {p.returncode}, {len(rows)} ranks reported\n"
                         f"{out[-4000:]}\n")
        return None, {}
    print(f"# {method}: {time.time() - t0:.1f} s", flush=True)
    return rows, {part: max(times) for part, times in parts.items()}  # (the slowest rank's median)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.environ.get("FTRUN_BUILD_DIR", "build"))
    p.add_argument("--mib-per-rank", type=int, default=256, help="parameters + Adam state per rank (MiB)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=4, help="saves per method (the runtime knob)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--per-node", type=int, default=2)
    p.add_argument("--store-mib", type=int, default=0, help="agent store budget (default: 4 x the node's state)")
    p.add_argument("--port", type=int, default=29731)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--workdir", default=None, help="where checkpoints go (local disk; default: a temp dir)")
    p.add_argument("--rank-mode", choices=METHODS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank_mode:
        return rank_main(a)
    if not a.store_mib:
        a.store_mib = 4 * a.mib_per_rank * a.per_node + 512
    workdir = a.workdir or tempfile.mkdtemp(prefix="ftrun-bench-fsdp-")
    res, parts = {}, {}
    for i, m in enumerate(x for x in a.methods.split(",") if x):
        a.port += 10 * i
        res[m], parts[m] = run_method(a, m, workdir)
    if not a.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    world = a.nodes * a.per_node
    print(f"state_mib_per_rank={a.mib_per_rank}")
    print(f"world={world}")
    print(f"steps={a.steps}")
    stall = {}
    peak0 = {}
    for m, rows in res.items():
        if rows is None:
            print(f"stall_s_{m}=nan")
            continue
        for part, sec in parts[m].items():  # get_state_dict's part; ftrun_overlap's wait at the next step
            print(f"{part}_s_{m}={sec:.4f}")
        per_step = [max(rows[r]["stalls"][s] for r in rows) for s in range(a.steps)]
        stall[m] = statistics.median(per_step)
        peak0[m] = rows[0]["hwm"] / 1024
        others = [rows[r]["hwm"] / 1024 for r in rows if r != 0] or [float("nan")]
        g0 = (rows[0]["hwm"] - rows[0]["hwm0"]) / 1024
        go = max(((rows[r]["hwm"] - rows[r]["hwm0"]) / 1024 for r in rows if r != 0), default=float("nan"))
        print(f"stall_s_{m}={stall[m]:.4f}")
        print(f"peak_mib_rank0_{m}={peak0[m]:.1f}")
        print(f"peak_mib_other_max_{m}={max(others):.1f}")
        print(f"save_peak_growth_mib_rank0_{m}={g0:.1f}")
        print(f"save_peak_growth_mib_other_max_{m}={go:.1f}")
        print(f"rank0_over_other_peak_{m}={peak0[m] / max(others):.3f}")
        shard_mib = max((r[0]["bytes"] for r in res.values() if r), default=0) / (1 << 20) or float("nan")
        print(f"save_peak_growth_over_shard_max_{m}={max(g0, go) / shard_mib:.3f}")
        anon = max((rows[r]["anon"] - rows[r]["anon0"]) / 1024 for r in rows)
        shmem = max((rows[r]["shmem"] - rows[r]["shmem0"]) / 1024 for r in rows)
        print(f"save_private_growth_mib_max_{m}={anon:.1f}")
        print(f"save_private_growth_over_shard_max_{m}={anon / shard_mib:.3f}")
        print(f"save_shared_growth_mib_max_{m}={shmem:.1f}")
    if "none" in res and res["none"]:
        print("(save_*_growth of a method minus that of 'none': the save's own memory)")
    for mine in ("ftrun", "ftrun_overlap"):
        if stall.get(mine, 0) > 0:
            for m in ("dcp", "dcp_async", "full"):
                if m in stall:
                    print(f"stall_ratio_{m}_over_{mine}={stall[m] / stall[mine]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
