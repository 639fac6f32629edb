"""ftrun.ddp_buckets on a real one-rank gloo process group and real DDP
modules: the layout a save records is the one DDP rebuilt, even at the save
right after the first step (before DDP's own rebuild); a DDP built after the
restore, or built before it and not yet run, starts with that layout; bad
layouts are refused with a warning and change nothing.

Run from the build tree: PYTHONPATH=build/python python3 -m pytest tests/unit_py/test_ddp_buckets.py
"""
import gc
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ftrun import ddp_buckets


pytestmark = pytest.mark.usefixtures("one_rank_group")  # (conftest.py)


def model():
    torch.manual_seed(0)
    # 1.6 MiB of parameters: the rebuilt layout has two buckets (DDP's first one is capped at 1 MiB).
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 768), nn.ReLU(), nn.Linear(768, 8))


def step(ddp):
    ddp(torch.randn(4, 64)).sum().backward()


def layout(ddp):
    data = ddp._get_ddp_logging_data()
    return data.get("bucket_sizes"), data.get("rebuilt_per_bucket_param_indices")


def saved_after_one_step():
    ddp = DDP(model())
    step(ddp)
    ddp_buckets._scan = True
    saved = [s for s in ddp_buckets.layouts_to_save() if s["params"][0][0] == [512, 64]]
    return ddp, saved


def test_the_save_after_the_first_step_records_the_layout_ddp_rebuilds(check):
    ddp, saved = saved_after_one_step()
    check(len(saved) == 1, f"one layout saved: {saved}")
    reference = DDP(model())
    step(reference)
    step(reference)
    step(reference)  # DDP's own rebuild (second forward), logged at the third
    want = layout(reference)[1]
    check(want and saved and ", ".join(" ".join(map(str, b)) for b in saved[0]["buckets"]) == want,
          f"saved {saved and saved[0]['buckets']}, DDP rebuilt {want}")
    check(saved and len(saved[0]["buckets"]) == 2, "two buckets")
    check(layout(ddp)[1] == want, f"the forced rebuild is DDP's: {layout(ddp)} vs {want}")


@pytest.mark.parametrize("built_first", [False, True])
def test_a_restored_ddp_starts_in_the_saved_layout(check, built_first):
    _, saved = saved_after_one_step()
    fresh = DDP(model()) if built_first else None
    ddp_buckets.restore(saved)
    fresh = fresh or DDP(model())
    sizes = [int(x) for x in layout(fresh)[0].split(",")]
    check(len(sizes) == 2, f"the new DDP starts with the saved two buckets, not one: {sizes}")
    check(not ddp_buckets._pending and ddp_buckets._original is None, "the layout was taken; nothing stays patched")
    step(fresh)
    check(dist._compute_bucket_assignment_by_size is ddp_buckets._original or ddp_buckets._original is None,
          "DDP's bucket assignment is torch's own again")


@pytest.mark.parametrize("bad", [
    {"params": [[[2], "torch.float32"]], "buckets": [[0, 0]]},
    {"params": [[[2], "torch.float32"]] * 2, "buckets": [[0], [7]]},
    {"params": [[[2], "torch.float32"]], "buckets": [[]]},
    {"buckets": [[0]]},
    "not a dict",
])
def test_a_malformed_layout_is_refused_and_changes_nothing(check, bad):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ddp_buckets.restore([bad])
    check(any("malformed DistributedDataParallel bucket layout" in str(w.message) for w in caught),
          f"a warning names it: {[str(w.message) for w in caught]}")
    check(not ddp_buckets._pending and ddp_buckets._original is None, "nothing armed")
    check(layout(DDP(model()))[0].count(",") == 0, "a new DDP starts in DDP's own single bucket")


def test_a_layout_no_ddp_takes_is_reported_at_the_next_save(check):
    _, saved = saved_after_one_step()
    other = [dict(saved[0], params=[[[3, 3], "torch.float32"]] * len(saved[0]["params"]))]
    ddp_buckets.restore(other)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ddp_buckets.layouts_to_save()
    check(any("matched no DDP module" in str(w.message) for w in caught), f"{[str(w.message) for w in caught]}")
    check(ddp_buckets._original is None, "the assignment is torch's own again")


def test_a_ddp_built_first_keeps_its_python_comm_hook_and_static_graph(check):
    """The reducer built again for a DDP made before the restore keeps what the user set on the old one."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    gc.collect()  # other tests' DDP modules that never ran would take layouts too
    _, saved = saved_after_one_step()
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    hooked = DDP(model())
    hooked.register_comm_hook(None, counting_hook)
    static = DDP(model(), static_graph=True)
    ddp_buckets.restore(saved + [dict(saved[0])])  # one layout for each
    check(len(layout(hooked)[0].split(",")) == 2 and len(layout(static)[0].split(",")) == 2,
          f"both start with the saved buckets: {layout(hooked)[0]!r}, {layout(static)[0]!r}")
    step(hooked)
    check(sorted(calls) == [0, 1], f"the comm hook ran for both buckets of the rebuilt reducer: {calls}")
    for _ in range(3):
        step(static)  # static graph: its first step delays every all-reduce to the end; no error
    check(static.static_graph and static.reducer is not None, "the static graph DDP trains on")
