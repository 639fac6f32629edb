"""ftrun.state_pack's reuse of the last save's packed structure
(ftrun.state_reuse): a state packed from the cache gives exactly the bytes of
the same state packed from scratch (skeleton, tensor metadata, dtypes, every
buffer), save after save, while the training changes values in place and
while the state changes under it: a tensor's shape, dtype, device, layout,
requires_grad or memory, a new key, a key of another type, an object leaf,
aliasing; and the structure comes back from those bytes as saved.

Run from the build tree: PYTHONPATH=build/python python3 -m pytest tests/unit_py/test_state_reuse.py
"""
import collections
import pickle
import random
import types

import numpy as np
import pytest
import torch

from ftrun import state_bytes, state_pack, state_reuse, state_unpack

Pair = collections.namedtuple("Pair", "left right")


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.delenv("FTRUN_SAVE_CACHE", raising=False)
    state_reuse.forget()
    yield
    state_reuse.forget()


def pack(state, reuse):
    """What a save hands the store: skeleton, pickled metadata, dtypes, {name: bytes}."""
    packer = state_pack._Packer(reuse=reuse)
    skeleton = packer.pack(state)
    arrays = {}
    for name, arr in packer.arrays.items():
        if isinstance(arr, state_bytes.CudaBytes):  # the CUDA save path's buffers
            arr = arr.tensor
        if isinstance(arr, torch.Tensor):
            arr = arr.detach().cpu().reshape(-1).view(torch.uint8).numpy()
        arrays[name] = np.ascontiguousarray(arr).tobytes()
    return {"skeleton": skeleton, "metas": packer.metas_pickle(), "dtypes": dict(packer.dtypes),
            "arrays": arrays}, packer


def same_as_uncached(state):
    """Packs state from the cache and from scratch; both must be byte for byte the same. Returns the cached pack."""
    hits = state_reuse.stats["hits"]
    cached, packer = pack(state, reuse=True)
    fresh, _ = pack(state, reuse=False)
    assert cached == fresh
    return cached, state_reuse.stats["hits"] > hits, packer


def unpacked(packed):
    """The structure back from a pack's bytes, through ftrun.state_unpack (as ftrun.load does)."""
    metas = pickle.loads(packed["metas"])
    arrays = {}
    for m in metas:
        raw = np.frombuffer(packed["arrays"][m["name"]], dtype=np.uint8).copy()
        dt = packed["dtypes"].get(m["name"])
        if m["enc"] == "native":
            arr = raw.view(np.dtype(m["dtype"].replace("bool", "bool_")) if dt is None else np.dtype(dt))
        elif m["enc"] == "bf16":
            arr = raw.view(np.int16)
        else:
            arr = raw
        arrays[m["name"]] = arr
    result = types.SimpleNamespace(version=1, tensors=arrays, user_bytes=pickle.dumps(
        {"format": "ftrun.state", "format_version": state_pack._FORMAT_VERSION, "tensors": packed["metas"]}))
    return state_unpack._Loaded(result, "ftrun.state").unpack(packed["skeleton"])


def equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def training_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def step(model, opt):
    loss = model(torch.randn(5, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def saved(model, opt, n):
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": n,
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
            "pair": Pair(torch.ones(3), [1, 2.5, "x"])}


def test_training_saves_hit_and_match():
    """A real training loop's state: from the second save on, every save is packed from the cache, and gives the
    uncached bytes; the buffers kept by the cache see the values the optimizer wrote in place."""
    model, opt = training_state()
    step(model, opt)
    hits = []
    for n in range(6):
        packed, hit, packer = same_as_uncached(saved(model, opt, n))
        hits.append(hit)
        assert equal(unpacked(packed), saved(model, opt, n))
        step(model, opt)
    assert hits == [False] + [True] * 5
    entry = state_reuse._entries[""]
    assert sum(v is not None for v in entry.views) >= len(list(model.parameters())), "parameters' buffers kept"


CHANGES = {
    "shape": lambda s: s["model"].__setitem__("0.weight", torch.zeros(16, 9)),
    "dtype": lambda s: s["model"].__setitem__("0.weight", s["model"]["0.weight"].double()),
    "device (meta)": lambda s: s["model"].__setitem__("0.bias", torch.empty(16, device="meta")),
    "layout (sparse)": lambda s: s["model"].__setitem__("0.bias", torch.zeros(16).to_sparse()),
    "requires_grad": lambda s: s["model"].__setitem__("0.bias", s["model"]["0.bias"].clone().requires_grad_()),
    "parameter": lambda s: s["model"].__setitem__("0.bias", torch.nn.Parameter(s["model"]["0.bias"].clone())),
    "new key": lambda s: s.__setitem__("extra", torch.arange(4)),
    "key type": lambda s: s["optim"]["state"].__setitem__(True, s["optim"]["state"].pop(1)),
    "atom to object": lambda s: s.__setitem__("step", np.int64(s["step"])),
    "aliased": lambda s: s["model"].__setitem__("2.bias", s["model"]["0.bias"]),
    "moved memory": lambda s: s["model"].__setitem__("0.bias", s["model"]["0.bias"].clone() + 1),
    "non-contiguous": lambda s: s["model"].__setitem__("0.weight", s["model"]["0.weight"].t().contiguous().t()),
    "namedtuple to tuple": lambda s: s.__setitem__("pair", tuple(s["pair"])),
    "shared container": lambda s: s.__setitem__("again", s["pair"][1]),
    "bfloat16": lambda s: s["model"].__setitem__("0.bias", s["model"]["0.bias"].bfloat16()),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_state_is_detected(change):
    """Two saves of one structure fill the cache; then one of them changes: the cached pack equals the uncached
    one, and comes back as saved; and the save after it (the change kept) too."""
    model, opt = training_state()
    step(model, opt)
    for n in range(2):
        same_as_uncached(saved(model, opt, n))
    for n in (2, 3):
        state = saved(model, opt, n)
        CHANGES[change](state)
        packed, _, _ = same_as_uncached(state)
        back = unpacked(packed)
        if change not in ("device (meta)", "layout (sparse)"):  # (those come back as torch pickles them)
            assert equal(back, state)
        step(model, opt)


def test_values_written_in_place_between_saves():
    """A kept buffer is the tensor's own memory: values written in place (the optimizer's way) are saved, and
    a complex tensor that turns into a conjugate view of the same memory is saved resolved."""
    w = torch.arange(6, dtype=torch.float32)
    z = torch.tensor([1 + 2j, 3 - 1j])
    for n in range(3):
        same_as_uncached({"w": w, "z": z})
    w.mul_(3)
    packed, hit, _ = same_as_uncached({"w": w, "z": z})
    assert hit and np.frombuffer(packed["arrays"]["w"], np.float32).tolist() == w.tolist()
    packed, _, _ = same_as_uncached({"w": w, "z": z.conj()})
    assert equal(unpacked(packed), {"w": w, "z": z.conj().resolve_conj()})


def test_structures_that_are_not_trees_are_pickled_whole():
    """A container reached twice, or a cycle: format 1 (the whole structure pickled), shared as saved."""
    inner = [torch.ones(2), 3]
    state = {"a": inner, "b": inner}
    packed, _, _ = same_as_uncached(state)
    assert isinstance(packed["skeleton"], bytes)
    back = unpacked(packed)
    assert back["a"] is back["b"] and equal(back, state)
    loop = {"t": torch.zeros(1)}
    loop["self"] = loop
    packed, _, _ = same_as_uncached(loop)
    back = unpacked(packed)
    assert back["self"] is back


def test_ordered_dict_metadata_and_defaultdict_come_back():
    """A module's state_dict (an OrderedDict with _metadata) and a defaultdict keep their types and attributes."""
    sd = torch.nn.Linear(2, 2).state_dict()
    dd = collections.defaultdict(list, {"k": [torch.ones(1)]})
    packed, _, _ = same_as_uncached({"sd": sd, "dd": dd})
    back = unpacked(packed)
    assert back["sd"]._metadata == sd._metadata and equal(back["sd"], sd)
    assert type(back["dd"]) is collections.defaultdict and back["dd"].default_factory is list


def test_cache_off(monkeypatch):
    """FTRUN_SAVE_CACHE=0: nothing is reused."""
    monkeypatch.setenv("FTRUN_SAVE_CACHE", "0")
    state = {"w": torch.ones(3)}
    for _ in range(3):
        _, hit, _ = same_as_uncached(state)
        assert not hit


def test_a_damaged_trace_is_refused():
    """A skeleton whose trace does not fit its leaves raises CORRUPTION, naming the version."""
    packed, _, _ = same_as_uncached({"w": torch.ones(3), "n": 1})
    trace, tidx = pickle.loads(packed["skeleton"]["tree"])
    packed["skeleton"] = dict(packed["skeleton"], tree=pickle.dumps((trace + ["a"], tidx)))
    with pytest.raises(Exception) as e:
        unpacked(packed)
    assert "CORRUPTION" in str(getattr(e.value, "code", "")) + str(e.value) and "version 1" in str(e.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_hit_and_match():
    """CUDA tensors (float32, bfloat16, and complex64 saved as raw bytes): the cached pack equals the uncached
    one, and every buffer of the CUDA save path, reused or not, is kept for the save's copies."""
    w = torch.arange(6.0, device="cuda")
    b = torch.zeros(3, dtype=torch.bfloat16, device="cuda")
    z = torch.tensor([1 + 2j], dtype=torch.complex64, device="cuda")
    for n in range(4):
        packed, hit, packer = same_as_uncached({"w": w, "b": b, "z": z, "n": n})
        assert hit == (n > 0)
        if state_pack._ftrun.CUDA and not state_pack._staging_forced():
            assert len(packer._device_keep) == 3, f"save {n}: {len(packer._device_keep)} CUDA buffers kept"
        w.add_(1)
