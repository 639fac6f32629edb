"""A rank (run by ftrun-agent) for test_torch_state.py.

    py_torch_rank.py checks               round trips through ftrun.save/load; prints PYTORCH OK <rank>
    py_torch_rank.py train STEPS SLEEP    a tiny deterministic model trained with Adam, saved every
                                          step, resumed after a restart; prints DIGEST <rank> <md5>
    py_torch_rank.py train STEPS 0 --no-ftrun   the same training without ftrun (the golden run)
"""
import collections
import hashlib
import os
import random
import sys
import time

import numpy as np
import torch
from rank_say import say

torch.set_num_threads(1)
MODE = sys.argv[1]
RANK = int(os.environ.get("RANK", "0"))

Pair = collections.namedtuple("Pair", ["left", "right"])


class Thing:
    """An arbitrary picklable object, with a tensor inside (pickled, not walked)."""

    def __init__(self, name, numbers, tensor):
        self.name = name
        self.numbers = numbers
        self.tensor = tensor



def fail(what):
    say(f"PYTORCH FAILED rank {RANK}: {what}")
    sys.exit(1)


def expect(cond, what):
    if not cond:
        fail(what)


def same_tensor(a, b, where):
    expect(isinstance(b, torch.Tensor), f"{where}: not a tensor ({type(b).__name__})")
    expect(a.dtype == b.dtype, f"{where}: dtype {b.dtype} != {a.dtype}")
    expect(tuple(a.shape) == tuple(b.shape), f"{where}: shape {tuple(b.shape)} != {tuple(a.shape)}")
    expect(a.device == b.device, f"{where}: device {b.device} != {a.device}")
    expect(a.requires_grad == b.requires_grad, f"{where}: requires_grad {b.requires_grad} != {a.requires_grad}")
    expect(type(a) is type(b), f"{where}: type {type(b).__name__} != {type(a).__name__}")
    # Bitwise: compare the bytes (NaN-safe, and -0.0 != 0.0).
    ab = a.detach().cpu().contiguous().reshape(-1)
    bb = b.detach().cpu().contiguous().reshape(-1)
    if ab.numel():
        ab, bb = ab.view(torch.uint8), bb.view(torch.uint8)
    expect(torch.equal(ab, bb), f"{where}: values differ")


def compare(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        return same_tensor(a, b, where)
    expect(type(a) is type(b), f"{where}: type {type(b).__name__} != {type(a).__name__}")
    if isinstance(a, dict):
        expect(list(a.keys()) == list(b.keys()), f"{where}: keys {list(b.keys())} != {list(a.keys())}")
        for k in a:
            compare(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        expect(len(a) == len(b), f"{where}: length {len(b)} != {len(a)}")
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{where}/{i}")
    elif isinstance(a, np.ndarray):
        expect(a.dtype == b.dtype and np.array_equal(a, b), f"{where}: numpy array differs")
    elif isinstance(a, Thing):
        expect(a.name == b.name and a.numbers == b.numbers, f"{where}: Thing fields differ")
        same_tensor(a.tensor, b.tensor, f"{where}.tensor")
    else:
        expect(a == b, f"{where}: {b!r} != {a!r}")


def adam_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def adam_steps(model, opt, n):
    for _ in range(n):
        x = torch.randn(5, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def run_checks():
    import ftrun

    expect(ftrun.load() is None, "fresh start: load() should be None")
    g = torch.Generator().manual_seed(100 + RANK)
    base = torch.randn(6, 10, generator=g)
    shared = torch.arange(20, dtype=torch.float32)
    twice = torch.randn(3, generator=g)
    model, opt = adam_model(7 + RANK)
    adam_steps(model, opt, 3)
    param = torch.nn.Parameter(torch.randn(4, generator=g))
    leaf = torch.randn(2, 2, generator=g).requires_grad_(True)
    state = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "nested": {
            "f32": torch.randn(64, 33, generator=g),
            "f16": torch.randn(300, generator=g).half(),
            "bf16": torch.randn(7, 5, generator=g).bfloat16(),
            "i64": torch.randint(-2 ** 40, 2 ** 40, (50,), generator=g, dtype=torch.int64),
            "bool": torch.rand(33, generator=g) > 0.5,
            "u8": torch.randint(0, 255, (9,), generator=g, dtype=torch.uint8),
            "f64": torch.randn(3, 3, generator=g, dtype=torch.float64),
            "complex": torch.randn(4, generator=g, dtype=torch.complex64),
            "list": [base.t(), (base[:, ::3], {"deep": torch.tensor(3.5)}), torch.empty(0, 3)],
            "tuple": (1, "x", torch.tensor(True), torch.zeros(0, dtype=torch.bfloat16)),
            "pair": Pair(torch.ones(2, 2), [1, 2, 3]),
            "0dim_i": torch.tensor(-7),
            "shared_a": shared,
            "shared_b": shared[4:9],
            "twice": [twice, twice],
            "param": param,
            "leaf": leaf,
            "weird key/with%slash": torch.ones(1),
            7: torch.full((2,), 7.0),
        },
        "rng": ftrun.rng_state(),
        "data_pos": {"epoch": 2, "batch": 17},
        "thing": Thing("thing", [1, 2.5, None], torch.arange(4)),
        "np": np.arange(12, dtype=np.int32).reshape(3, 4),
        "text": "hello",
    }
    expect(not state["nested"]["list"][0].is_contiguous(), "test setup: a non-contiguous view")
    cuda = torch.cuda.is_available()
    if cuda:
        state["cuda"] = {
            "f32": torch.randn(16, 16, generator=g).cuda(),
            "bf16": torch.randn(9, generator=g).bfloat16().cuda(),
            "view": torch.randn(8, 8, generator=g).cuda().t(),
            "0dim": torch.tensor(2.0, device="cuda"),
        }
    else:
        say(f"rank {RANK}: CUDA not available: CUDA round trips skipped")

    stats = ftrun.save(1, state, wait=True)
    expect(stats["bytes_total"] > 0, f"save stats {stats}")
    # Draws after the save: the restored generators must give the same numbers.
    after = (torch.rand(5), np.random.rand(3), random.random(), torch.randn(3, device="cuda") if cuda else None)

    got = ftrun.load()
    expect(got is not None, "load() after a committed save")
    step, back = got
    expect(step == 1, f"step {step}")
    rng = back["rng"]
    compare({k: v for k, v in state.items() if k != "rng"}, {k: v for k, v in back.items() if k != "rng"})
    compare(state["rng"]["torch"], rng["torch"], "rng/torch")
    expect(rng["python"] == state["rng"]["python"], "rng/python")
    expect(type(back["model"]) is collections.OrderedDict, "model state_dict type")
    expect(getattr(back["model"], "_metadata", None) == getattr(state["model"], "_metadata", None),
           "state_dict _metadata")
    expect(back["nested"]["twice"][0] is back["nested"]["twice"][1], "one tensor reached twice is one object")
    expect(back["nested"]["shared_b"].tolist() == list(range(4, 9)), "a view sharing storage")
    expect(back["nested"]["list"][0].is_contiguous(), "views come back contiguous")
    # Loaded CPU tensors are views of the loaded buffers: writable, no copy on the way.
    back["nested"]["f32"][0, 0] = 1.0

    ftrun.set_rng_state(rng)
    again = (torch.rand(5), np.random.rand(3), random.random(), torch.randn(3, device="cuda") if cuda else None)
    expect(torch.equal(after[0], again[0]), "torch RNG continues identically")
    expect(np.array_equal(after[1], again[1]), "numpy RNG continues identically")
    expect(after[2] == again[2], "python RNG continues identically")
    if cuda:
        expect(torch.equal(after[3], again[3]), "CUDA RNG continues identically")

    # The loaded optimizer state drives a fresh optimizer exactly like the original.
    model2, opt2 = adam_model(999)
    model2.load_state_dict(back["model"])
    opt2.load_state_dict(back["optim"])
    torch.manual_seed(5)
    adam_steps(model, opt, 2)
    torch.manual_seed(5)
    adam_steps(model2, opt2, 2)
    for (n, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        same_tensor(a, b, f"after 2 more Adam steps: {n}")

    # map_location: everything to the CPU, and a torch-style callable.
    _, on_cpu = ftrun.load(map_location="cpu")
    expect(all(t.device.type == "cpu" for t in on_cpu["nested"]["list"][:1]), "map_location='cpu'")
    if cuda:
        expect(on_cpu["cuda"]["f32"].device.type == "cpu", "map_location='cpu' moves CUDA tensors")
        expect(back["cuda"]["f32"].device.type == "cuda", "CUDA tensors come back on CUDA")
    seen = []
    ftrun.load(map_location=lambda t, loc: seen.append(loc) or t)
    expect(len(seen) > 10 and "cpu" in seen, f"callable map_location called with locations {set(seen)}")

    # Same layout, new values: a second version.
    state["nested"]["f32"] += 1
    state["data_pos"]["batch"] = 18
    ftrun.save(2, state, wait=True)
    step, back = ftrun.load()
    expect(step == 2 and back["data_pos"]["batch"] == 18, "second version")
    same_tensor(state["nested"]["f32"], back["nested"]["f32"], "f32 after the in-place change")
    step, back1 = ftrun.load(2)
    expect(step == 2, "load(2)")

    # A different layout is refused with a hint.
    state["nested"]["extra"] = torch.zeros(3)
    try:
        ftrun.save(3, state)
        fail("a save with an extra tensor was accepted")
    except ftrun.Error as e:
        expect(e.code == "FAILED_PRECONDITION", f"layout change: code {e.code}")
        expect("same structure" in e.message and "extra" in e.message, f"layout change message: {e.message}")
        say(f"rank {RANK}: layout change refused: {e.message[:160]}...")
    del state["nested"]["extra"]
    # A step that does not increase is refused.
    try:
        ftrun.save(2, state)
        fail("a save of an old step was accepted")
    except ftrun.Error as e:
        expect(e.code == "FAILED_PRECONDITION", f"old step: code {e.code}")
    ftrun.save(3, state)
    ftrun.wait()

    # overlap=True with host tensors: the save returns once packed, the copy into the store runs
    # behind the next forward and backward pass, and the optimizer step waits for it first: the
    # version holds the model and optimizer as they were at the save.
    want = {"model": {k: v.clone() for k, v in state["model"].items()},
            "optim": {k: {n: t.clone() for n, t in v.items()} for k, v in opt.state_dict()["state"].items()}}
    stats = ftrun.save(4, state, overlap=True)
    expect(stats.get("overlapped") and stats.get("version") == 4, f"an overlapped host save says so: {stats}")
    loss = model(torch.randn(5, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()  # writes the saved parameters: waits for the copy first
    expect(not torch.equal(model[0].weight, want["model"]["0.weight"]), "the step after the save changed the model")
    ftrun.wait()
    step, back = ftrun.load(4)
    expect(step == 4, f"load(4) gave {step}")
    compare(want["model"], dict(back["model"]), "overlapped save: model")
    compare(want["optim"], {k: dict(v) for k, v in back["optim"]["state"].items()}, "overlapped save: optimizer")
    # An error of the background copy is raised where the next optimizer step waits for it.
    state["nested"]["extra"] = torch.zeros(3)
    ftrun.save(5, state, overlap=True)
    try:
        opt.step()
        fail("an overlapped save with an extra tensor raised nothing at the next optimizer step")
    except ftrun.Error as e:
        expect(e.code == "FAILED_PRECONDITION" and "same structure" in e.message,
               f"overlapped layout change: code {e.code}: {e.message}")
    del state["nested"]["extra"]
    ftrun.save(5, state, overlap=True)
    ftrun.wait()
    expect(ftrun.load()[0] == 5, "the overlapped save after a refused one is committed")
    say(f"PYTORCH OK {RANK}")


# --------------------------------------------------------------------------
# Training with a restart


DATASET = 64


def train(steps, sleep, use_ftrun):
    torch.manual_seed(1234 + RANK)
    random.seed(99 + RANK)
    np.random.seed(77 + RANK)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Tanh(),
                                torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    data_g = torch.Generator().manual_seed(5)
    xs, ys = torch.randn(DATASET, 8, generator=data_g), torch.randn(DATASET, 4, generator=data_g)
    perm = torch.randperm(DATASET, generator=data_g)
    pos = 0
    start = 0
    if use_ftrun:
        import ftrun

        resumed = ftrun.load()
        if resumed is not None:
            step, st = resumed
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["optim"])
            ftrun.set_rng_state(st["rng"])
            pos = st["data_pos"]
            start = step + 1
            say(f"RESUMED {RANK} at step {start}")
    for step in range(start, steps):
        idx = perm[torch.arange(pos, pos + 4) % DATASET]
        pos = (pos + 4) % DATASET
        noise = float(np.random.rand()) * 0.01 + random.random() * 0.01  # numpy and python RNGs matter too
        loss = (model(xs[idx] + noise) - ys[idx]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if use_ftrun:
            ftrun.save(step, {"model": model.state_dict(), "optim": opt.state_dict(),
                              "rng": ftrun.rng_state(), "data_pos": pos})
            say(f"STEP {RANK} {step}")
            time.sleep(sleep)
    if use_ftrun:
        ftrun.wait()
    h = hashlib.md5()
    for t in list(model.state_dict().values()):
        h.update(t.numpy().tobytes())
    for s in opt.state_dict()["state"].values():
        h.update(s["exp_avg"].numpy().tobytes())
        h.update(s["exp_avg_sq"].numpy().tobytes())
    say(f"DIGEST {RANK} {h.hexdigest()}")


if MODE == "checks":
    run_checks()
elif MODE == "train":
    train(int(sys.argv[2]), float(sys.argv[3]), "--no-ftrun" not in sys.argv)
else:
    fail(f"unknown mode {MODE}")
