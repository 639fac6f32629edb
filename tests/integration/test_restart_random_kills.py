"""SIGKILL ranks at random moments, many times, including in the middle of
a save; every run must end with the digests of the failure-free run."""
import os
import random
import signal
import time

import pytest

from ftrun_testlib import Job, digests, golden

NRANKS = 4
ARGS = ["--state-bytes", "8MiB", "--tensors", "4", "--steps", "60", "--step-ms", "8",
        "--change-fraction", "0.3"]
CONFIG = "job:\n  max_restarts: 20\n  stop_grace: 2s\nstore:\n  memory_budget: 512MiB\n  chunk_size: 1MiB\n"


@pytest.fixture(scope="module")
def rng():
    seed = int(os.environ.get("FTRUN_TEST_SEED", time.time()))
    print("seed", seed, "(set FTRUN_TEST_SEED to replay)")
    return random.Random(seed)


@pytest.fixture(scope="module")
def want():
    return golden(NRANKS, ARGS)


def test_random_kills(check, rng, want):
    """10 runs, each with 1 to 4 ranks SIGKILLed at random moments: one restart per kill, and the
    failure-free digests."""
    kills_total = 0
    for run in range(10):
        job = Job(NRANKS, ARGS, CONFIG)
        kills = rng.randint(1, 4)
        done = 0
        for k in range(kills):
            # Wait for the generation to be up, then kill at a random moment.
            st = job.wait_for(lambda s: s["restarts"] == done and all(r["pid"] for r in s["ranks"]), timeout=60)
            if st is None or st["state"] != "running":
                break
            time.sleep(rng.uniform(0.0, 0.25))
            if job.kill_rank(rng.randrange(NRANKS), signal.SIGKILL):
                done += 1
        rc = job.wait()
        kills_total += done
        got = digests(job.log)
        check(rc == 0, f"run {run}: agent exit {rc} after {done} kills\n{job.log[-3000:]}")
        check(got == want, f"run {run}: digests {got} != golden {want}")
        check(job.state()["restarts"] == done, f"run {run}: {job.state()['restarts']} restarts for {done} kills")
    print(f"{kills_total} kills survived")


def test_kills_during_save(check, rng, want):
    """A rank killed from a thread while Save is copying chunks or sending its manifest: the half-written save
    must never count (8 runs)."""
    for run in range(8):
        crash_step = rng.randint(2, 50)
        args = ARGS + ["--crash-at-step", str(crash_step), "--crash-rank", str(rng.randrange(NRANKS)),
                       "--crash-during-save"]
        job = Job(NRANKS, args, CONFIG)
        rc = job.wait()
        check(rc == 0, f"mid-save run {run} (step {crash_step}): agent exit {rc}\n{job.log[-3000:]}")
        check(digests(job.log) == want, f"mid-save run {run}: digests differ from golden")
        check(job.state()["restarts"] == 1, f"mid-save run {run}: expected one restart")
