"""A rank with a CUDA training state, run by tests/gpu/test_cuda_state.py
under ftrun-agent (one rank, one GPU).

  checks          every dtype, views and mixed host/CUDA states round-trip
                  byte for byte through the CUDA save path; a save with 10%
                  of the chunks changed copies only those chunks; a kernel
                  that overwrites a tensor right after save returns never
                  changes the saved bytes (default and side streams)
  train STEPS P   a CUDA "model" updated every step and saved every step;
                  after a restart it resumes from the restored version on
                  cuda:0 and prints a DIGEST of its final bytes (P: seconds
                  slept per step, so the test can kill it mid-run)
"""
import hashlib
import sys
import time

import torch

import ftrun

CHUNK = 1 << 20  # the test's store.chunk_size


def fail(what):
    print(f"CUDA CHECK FAILED: {what}", flush=True)
    sys.exit(1)


def same_bytes(a, b):
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if a.numel() == 0:
        return True
    return torch.equal(byte_view(a), byte_view(b))


def byte_view(t):
    flat = t.detach().contiguous().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(torch.uint8).cpu()


def dtype_state(dev):
    g = torch.Generator(device="cpu").manual_seed(5)
    base = torch.randn(257, 33, generator=g)
    state = {
        "f32": base.to(dev),
        "f16": base.half().to(dev),
        "bf16": base.bfloat16().to(dev),
        "f64": base.double().to(dev),
        "i64": (base * 1000).long().to(dev),
        "i32": (base * 1000).int().to(dev),
        "i8": (base * 10).to(torch.int8).to(dev),
        "u8": (base.abs() * 10).to(torch.uint8).to(dev),
        "bool": (base > 0).to(dev),
        "c64": torch.complex(base, -base).to(dev),
        "transposed": base.to(dev).t(),            # non-contiguous
        "slice": base.to(dev)[3:200:7, 1:30],      # a strided view
        "scalar": torch.tensor(3.5, device=dev),
        "empty": torch.empty(0, 4, device=dev),
        "host": base.clone(),                       # mixed: a CPU tensor
        "nested": {"list": [base[:5].to(dev), 7], "param": torch.nn.Parameter(base[:9].to(dev))},
    }
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):
            state[name] = base.to(getattr(torch, name)).to(dev)
    return state


def flatten(prefix, a, out):
    if isinstance(a, dict):
        for k, v in a.items():
            flatten(prefix + "/" + k, v, out)
    elif isinstance(a, list):
        for i, v in enumerate(a):
            flatten(prefix + "/" + str(i), v, out)
    else:
        out[prefix] = a


def check_round_trip(state):
    stats = ftrun.save(1, state, wait=True)
    step, got = ftrun.load(1)
    flat_want, flat_got = {}, {}
    flatten("", state, flat_want)
    flatten("", got, flat_got)
    for k, want in flat_want.items():
        g = flat_got.get(k)
        if not isinstance(want, torch.Tensor):
            if g != want:
                fail(f"{k}: {g!r} != {want!r}")
            continue
        if not isinstance(g, torch.Tensor) or g.device != want.device:
            fail(f"{k}: came back on {getattr(g, 'device', None)}, saved from {want.device}")
        if not same_bytes(g, want):
            fail(f"{k}: bytes differ after the round trip ({want.dtype}{list(want.shape)})")
    if not isinstance(got["nested"]["param"], torch.nn.Parameter):
        fail("nested/param did not come back as a Parameter")
    _, on_cpu = ftrun.load(1, map_location="cpu")
    flat_cpu = {}
    flatten("", on_cpu, flat_cpu)
    for k, want in flat_want.items():
        if isinstance(want, torch.Tensor) and (flat_cpu[k].device.type != "cpu" or
                                               not same_bytes(flat_cpu[k], want.cpu())):
            fail(f"{k}: map_location='cpu' did not give the saved bytes on the CPU")
    print(f"rank round trip: {len(flat_want)} entries, {stats['bytes_total']} bytes, byte-identical "
          "(on the device and with map_location='cpu')", flush=True)


def check_changed_chunks(state):
    ftrun.save(2, state, wait=True)  # every fingerprint known: nothing changed
    big = state["big"]
    per_chunk = CHUNK // 4
    changed = [0, 5, 11]
    for c in changed:
        big[c * per_chunk + 17] += 1.0
    stats = ftrun.save(3, state, wait=True)
    if stats["chunks_copied"] != len(changed) or stats["bytes_copied"] != len(changed) * CHUNK:
        fail(f"{len(changed)} of {stats['chunks_total']} chunks changed, the save copied {stats['chunks_copied']} "
             f"chunks, {stats['bytes_copied']} bytes")
    _, got = ftrun.load(3)
    if not same_bytes(got["big"], big) or not same_bytes(got["other"], state["other"]):
        fail("the incremental save's bytes differ from the device's")
    print(f"rank changed chunks: {stats['chunks_copied']} of {stats['chunks_total']} copied "
          f"({stats['bytes_copied']} bytes), the rest unchanged", flush=True)


def check_write_after_save(state, version, side_stream):
    w = state["w"]
    torch.cuda.synchronize()
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream), torch.no_grad():
        w.fill_(1.0)
        ftrun.save(version, state)
        w.fill_(2.0)          # queued right after save returned: must wait for the copies
        w.mul_(3.0)
    ftrun.wait()
    torch.cuda.synchronize()
    _, got = ftrun.load(version)
    if not torch.all(got["w"] == 1.0):
        bad = int((got["w"] != 1.0).sum())
        fail(f"a write queued after save changed {bad} saved values (side stream: {side_stream})")
    if not torch.all(w == 6.0):
        fail("the write after save did not happen")
    print(f"rank write after save: saved bytes unchanged (side stream: {side_stream})", flush=True)


def check_overlapped_save(state, version):
    """save(overlap=True): the copies overlap later work; an optimizer step
    queued right after save must still wait for them."""
    w = state["w"]
    with torch.no_grad():
        w.fill_(1.0)
    w.grad = torch.ones_like(w)
    opt = torch.optim.SGD([w], lr=1.0)
    torch.cuda.synchronize()
    ftrun.save(version, state, overlap=True)
    opt.step()                # w -= grad: queued right after save returned
    ftrun.wait()
    torch.cuda.synchronize()
    _, got = ftrun.load(version)
    if not torch.all(got["w"] == 1.0):
        fail(f"an optimizer step after save(overlap=True) changed {int((got['w'] != 1.0).sum())} saved values")
    if not torch.all(w == 0.0):
        fail("the optimizer step after save did not happen")
    w.grad = None
    print("rank overlapped save: an optimizer step after it waited for the copies", flush=True)


def checks():
    dev = torch.device("cuda", torch.cuda.current_device())
    # One layout for every save (the store keeps a rank's first layout).
    state = dtype_state(dev)
    state["big"] = torch.randn(16 * CHUNK // 4, device=dev)     # 16 chunks
    state["other"] = torch.randn(8 * CHUNK // 4, device=dev)    # 8 chunks, never changed
    # 256 MiB: the copies take long enough for a race to show.
    state["w"] = torch.nn.Parameter(torch.full((256 * CHUNK // 4,), 1.0, device=dev))
    check_round_trip(state)
    check_changed_chunks(state)
    for i in range(3):
        check_write_after_save(state, 10 + 2 * i, side_stream=False)
        check_write_after_save(state, 11 + 2 * i, side_stream=True)
    for i in range(3):
        check_overlapped_save(state, 20 + i)
    print("CUDA CHECKS OK", flush=True)


def train(steps, pause):
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    start = 0
    resumed = ftrun.load()
    if resumed is None:
        g = torch.Generator(device="cpu").manual_seed(9)
        state = {"w": torch.randn(3 * CHUNK // 4 + 5, generator=g).to(dev),
                 "m": torch.zeros(1000, dtype=torch.bfloat16, device=dev), "step": 0}
    else:
        step, state = resumed
        for k in ("w", "m"):
            if state[k].device != dev:
                fail(f"restored '{k}' is on {state[k].device}, not {dev}")
        start = step + 1
        print(f"RESUMED {ftrun.get_client().rank} {step}", flush=True)
    for step in range(start, steps):
        w, m = state["w"], state["m"]
        w.mul_(0.999).add_(torch.sin(w + step))
        m.add_(w[:1000].to(torch.bfloat16))
        state["step"] = step
        ftrun.save(step, state)
        time.sleep(pause)
    ftrun.wait()
    digest = hashlib.sha256()
    for k in ("w", "m"):
        digest.update(byte_view(state[k]).numpy().tobytes())
    print(f"DIGEST 0 {digest.hexdigest()[:32]}", flush=True)


def main():
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device", flush=True)
        sys.exit(77)
    if sys.argv[1] == "checks":
        checks()
    elif sys.argv[1] == "train":
        if "--no-ftrun" in sys.argv:  # the failure-free golden run, without an agent
            ftrun.save = lambda step, state, wait=False: None
            ftrun.load = lambda *a, **k: None
            ftrun.wait = lambda *a, **k: None
        train(int(sys.argv[2]), float(sys.argv[3]))
    else:
        fail(f"unknown mode {sys.argv[1]}")


if __name__ == "__main__":
    main()
