"""ftrun.accelerate's refusals, with a real accelerate Accelerator (one CPU
process, no agent needed: each check comes before any ftrun call): an FSDP or
DeepSpeed accelerator is refused naming the ftrun path to use instead, and a
saved version whose prepared objects do not match this accelerator's is
refused naming both counts. And the iterator recorder: a DataLoader's
shuffling generator is recorded as it was just before an epoch's iterator
drew from it.

Run from the build tree: PYTHONPATH=build/python python3 -m pytest tests/unit_py/test_accelerate_inputs.py
"""
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

import ftrun
import ftrun.accelerate as fta


def test_fsdp_and_deepspeed_accelerators_are_refused_with_the_path_to_use(check):
    acc = Accelerator(cpu=True)
    for kind, words in ((DistributedType.FSDP, "get_state_dict"), (DistributedType.DEEPSPEED, "ftrun.deepspeed")):
        acc.state.distributed_type = kind
        for call in (lambda: fta.save_state(acc, 1), lambda: fta.load_state(acc)):
            try:
                call()
                check(False, f"{kind}: accepted")
            except ftrun.Error as e:
                check(e.code == "FAILED_PRECONDITION" and words in e.message, f"{kind}: {e.message}")
    acc.state.distributed_type = DistributedType.NO


def test_a_version_with_other_prepared_objects_is_refused_naming_both_counts(check):
    try:
        fta._expect_same_count({"optimizers": [{}, {}]}, "optimizers", [object()], "optimizers")
        check(False, "two saved optimizers loaded into one")
    except ftrun.Error as e:
        check(e.code == "FAILED_PRECONDITION" and "holds 2 optimizers" in e.message and "has 1" in e.message,
              e.message)


def test_the_generator_is_recorded_before_an_epoch_draws(check):
    g = torch.Generator().manual_seed(7)
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=2, shuffle=True, generator=g)
    before = g.get_state()
    first = [b.tolist() for b in loader]
    recorded = loader._ftrun_before_iterator.get(id(g))
    check(recorded is not None and torch.equal(recorded, before), "the state before the first epoch is recorded")
    second = [b.tolist() for b in loader]
    check(second != first, "test setup: the second epoch draws another order")
    g.set_state(loader._ftrun_before_iterator[id(g)])
    check([b.tolist() for b in loader] == second, "the recorded state draws the second epoch's order again")
