"""A rank of test_export.py: saves a nested torch state (every common dtype
incl. bfloat16, Adam state, RNG states, a user object, a tensor of many
chunks) at steps 1..3 through ftrun.save, and records what it saved in
REFDIR: the store's bytes as Client.load returns them, and torch.save of
the state. Run as `py_export_rank.py REFDIR` under ftrun-agent.

The state's classes (Thing, Pair) are this module's, importable by the
test that unpickles what the rank saved."""
import collections
import os
import pickle
import sys
import time

Pair = collections.namedtuple("Pair", ["left", "right"])


class Thing:
    """A user object (pickled into the user bytes), with a tensor inside."""

    def __init__(self, name, numbers, tensor):
        self.name, self.numbers, self.tensor = name, numbers, tensor


def rank_main(refdir):
    import torch

    import ftrun

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    torch.manual_seed(10 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(1, 4):
        loss = model(torch.randn(5, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state = {
            "model": model.state_dict(), "optim": opt.state_dict(), "rng": ftrun.rng_state(),
            "nested": {
                "bf16": torch.randn(7, 5).bfloat16(), "f16": torch.randn(300).half(),
                "i64": torch.randint(-2 ** 40, 2 ** 40, (50,)), "bool": torch.rand(33) > 0.5,
                "u8": torch.randint(0, 255, (9,), dtype=torch.uint8), "f64": torch.randn(3, 3, dtype=torch.float64),
                "big": torch.randn(300_000),  # ~18 chunks of 64 KiB
                "0dim": torch.tensor(-7), "empty": torch.empty(0, 3), "weird key/with%slash": torch.ones(1),
                "list": [torch.arange(6).reshape(2, 3).t(), (1, "x", torch.tensor(True))],
                "pair": Pair(torch.ones(2, 2), [1, 2, 3]),
            },
            "thing": Thing("thing", [1, 2.5, None], torch.arange(4)),
            "pos": {"epoch": 2, "step": step},
        }
        ftrun.save(step, state, wait=True)
        got = ftrun.state.get_client().load(step)  # what the store holds for this rank
        saved = {n: (got.dtypes[n], tuple(a.shape), a.tobytes()) for n, a in got.tensors.items()}
        with open(os.path.join(refdir, f"saved-r{rank}-v{step}.pkl"), "wb") as f:
            pickle.dump({"tensors": saved, "order": list(got.tensors), "user_bytes": got.user_bytes}, f)
        torch.save(state, os.path.join(refdir, f"state-r{rank}-v{step}.pt"))
        time.sleep(0.4)  # lets the flusher write each version (it skips to the newest when behind)
    os.write(1, f"EXPORT RANK OK {rank}\n".encode())


if __name__ == "__main__":
    # Through the module's name, so that pickles name py_export_rank.Thing, not __main__.Thing.
    import py_export_rank

    py_export_rank.rank_main(sys.argv[1])
