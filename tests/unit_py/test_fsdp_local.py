"""ftrun.fsdp_local on a real one-rank gloo process group and real FSDP1
modules (CPU): the local state of a trained model and its optimizer, put
into a model and optimizer built and wrapped the same way, makes them equal
to the saved ones, bit for bit, and they then train on identically; a state
of another wrapping, world size, optimizer count or param groups is refused,
naming what differs, and changes nothing. (Bit-identical runs of Lightning's
FSDPStrategy killed and restarted with it: test_ddp_exact.py's
lightning_fsdp.)

Run from the build tree: PYTHONPATH=build/python python3 -m pytest tests/unit_py/test_fsdp_local.py
"""
import copy

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from ftrun import fsdp_local


pytestmark = pytest.mark.usefixtures("one_rank_group")  # (conftest.py)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def build(seed, per_block=True, use_orig_params=True):
    torch.manual_seed(seed)
    model = nn.Sequential(Block(), Block(), nn.Linear(8, 2))
    policy = ModuleWrapPolicy({Block}) if per_block else None
    fsdp = FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"), use_orig_params=use_orig_params)
    return fsdp, torch.optim.AdamW(fsdp.parameters(), lr=1e-2)


def train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        model(torch.randn(4, 8, generator=g)).square().sum().backward()
        opt.step()
        opt.zero_grad()


def snapshot(model, opt):
    """Every flat shard's and optimizer state tensor's bytes, and the param groups' settings."""
    flat = [u._flat_param.detach().clone() for u in FSDP.fsdp_modules(model) if u._flat_param is not None]
    sd = opt.state_dict()
    state = {k: {n: v.clone() for n, v in s.items()} for k, s in sd["state"].items()}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    return flat, state, groups


def same(a, b):
    (fa, sa, ga), (fb, sb, gb) = a, b
    return (len(fa) == len(fb) and all(torch.equal(x, y) for x, y in zip(fa, fb)) and sa.keys() == sb.keys()
            and all(sa[k].keys() == sb[k].keys() and all(torch.equal(sa[k][n], sb[k][n]) for n in sa[k])
                    for k in sa) and ga == gb)


@pytest.mark.parametrize("use_orig_params", [True, False])
def test_a_local_state_put_back_is_the_state_bit_for_bit(check, use_orig_params):
    model, opt = build(1, use_orig_params=use_orig_params)
    train(model, opt, 3, seed=5)
    saved = fsdp_local.local_state(model, [opt])
    want = snapshot(model, opt)
    saved = copy.deepcopy(saved)  # (tensors of its own, as a load returns: not the live ones)
    other, other_opt = build(2, use_orig_params=use_orig_params)
    train(other, other_opt, 1, seed=6)
    check(not same(snapshot(other, other_opt), want), "the second model starts different")
    fsdp_local.restore_local_state(other, [other_opt], saved)
    check(same(snapshot(other, other_opt), want), "the restored model and optimizer equal the saved ones")
    train(model, opt, 2, seed=7)
    train(other, other_opt, 2, seed=7)
    check(same(snapshot(other, other_opt), snapshot(model, opt)), "both train on identically")


def test_another_wrapping_world_optimizer_count_or_param_groups_is_refused_and_changes_nothing(check):
    model, opt = build(1)
    train(model, opt, 1, seed=5)
    saved = fsdp_local.local_state(model, [opt])
    saved = copy.deepcopy(saved)
    other, other_opt = build(2, per_block=False)  # one FSDP unit, not three
    before = snapshot(other, other_opt)
    model3, opt3 = build(3)
    before3 = snapshot(model3, opt3)
    cases = [
        (other, [other_opt], saved, "the saved model has 3 FSDP units, the live one 1"),
        (model3, [opt3], {**saved, "world": 4}, "saved on 4 ranks, restored on 1"),
        (model3, [], saved, "1 optimizer states saved, 0 optimizers"),
        (other, [other_opt], {"format": 9}, "not an FSDP local state of format 1: 9"),
        (model3, [torch.optim.AdamW(list(model3.parameters())[:1])], saved,
         "optimizer 0 has param groups of [1] parameters, the saved one"),
    ]
    for target, optimizers, state, why in cases:
        with pytest.raises(ValueError) as e:
            fsdp_local.restore_local_state(target, optimizers, state)
        check(why in str(e.value), f"refused naming {why!r}: {e.value}")
    check(same(snapshot(other, other_opt), before), "a refused state changed nothing")
    check(same(snapshot(model3, opt3), before3), "a refused state changed nothing (param groups last)")
    shrunk = {**saved, "flat": [saved["flat"][0][:-1]] + saved["flat"][1:]}
    model2, opt2 = build(4)
    before2 = snapshot(model2, opt2)
    with pytest.raises(ValueError) as e:
        fsdp_local.restore_local_state(model2, [opt2], shrunk)
    check("FSDP unit 0" in str(e.value) and "wrap the model the same way" in str(e.value), str(e.value))
    check(same(snapshot(model2, opt2), before2), "a refused unit changed nothing")
