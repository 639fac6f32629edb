"""`ftrun export` and ftrun.load_persisted / ftrun.load_exported on a real job.

1. Two Python ranks (this file, run as `test_export.py rank REFDIR`) under a
1. Two Python ranks (py_export_rank.py REFDIR) under a
   real ftrun-agent with persist.dir save a nested torch state (every common
   many chunks) at steps 1..3. Each rank records what it saved: the store's
   bytes as Client.load returns them, and torch.save of the state.
2. `ftrun export` of the newest version: a safetensors reader written here
   (and the `safetensors` package where installed) finds every tensor with the
   bytes the rank saved, and the user bytes; index.json lists ranks and
   tensors. An older version and one rank (--version, --ranks) too.
3. ftrun.load_persisted / ftrun.load_exported give back the rank's state:
   structure, dtypes, values, user objects. The synthetic C++ trainer's
   versions export too (opaque user bytes).
4. On a terminal (a pty) the export shows bytes, rate and time left.
5. A corrupt and a missing chunk file: export exits 1 naming the file and
   leaves nothing behind; load_persisted raises CORRUPTION naming it.
6. Bad inputs exit 2 naming the path and what was expected.
"""
import json
import os
import pickle
import pty
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch

import ftrun
from ftrun_testlib import Job, PY, RUNNER, scratch
from py_export_rank import Thing

HERE = os.path.dirname(os.path.abspath(__file__))
ST_DTYPES = {"uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "float16": "F16",
             "bfloat16": "BF16", "float32": "F32", "float64": "F64", "bool": "BOOL", "uint16": "U16",
             "uint32": "U32", "uint64": "U64"}
ST_SIZES = {"U8": 1, "I8": 1, "BOOL": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
            "I64": 8, "U64": 8, "F64": 8}


def read_safetensors(check, path):
    """A reader of the format written here independently of ftrun's: returns
    (metadata, {name: (dtype, shape, bytes)}) after checking the layout rules
    the safetensors library enforces."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    check((8 + n) % 8 == 0, f"{path}: header padded to 8 bytes (length {n})")
    text = blob[8:8 + n].decode("utf-8")
    check(text.startswith("{") and text.rstrip(" ").endswith("}"), f"{path}: a JSON header padded with spaces")
    header = json.loads(text)
    meta = header.pop("__metadata__", {})
    check(all(isinstance(v, str) for v in meta.values()), f"{path}: metadata values are strings: {meta}")
    data = blob[8 + n:]
    out, spans = {}, []
    for name, e in header.items():
        b, end = e["data_offsets"]
        size = ST_SIZES[e["dtype"]] * int(np.prod(e["shape"], dtype=np.int64))
        check(end - b == size, f"{path}: '{name}' {e['dtype']}{e['shape']} spans {end - b} bytes, not {size}")
        spans.append((b, end))
        out[name] = (e["dtype"], tuple(e["shape"]), data[b:end])
    spans.sort()
    check(spans[0][0] == 0 and spans[-1][1] == len(data) and all(a[1] == b[0] for a, b in zip(spans, spans[1:])),
          f"{path}: the tensors cover the data contiguously, without holes")
    return meta, out


def same(a, b, where="state"):
    """Structure, types, dtypes and bits equal; returns the first difference or ''."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
            return f"{where}: {getattr(b, 'dtype', type(b))}{list(getattr(b, 'shape', []))} != {a.dtype}{list(a.shape)}"
        x, y = a.detach().contiguous().reshape(-1), b.detach().contiguous().reshape(-1)
        if x.numel() and not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
            return f"{where}: values differ"
        return ""
    if type(a) is not type(b):
        return f"{where}: type {type(b).__name__} != {type(a).__name__}"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(b)} != {list(a)}"
        return next((d for d in (same(a[k], b[k], f"{where}/{k}") for k in a) if d), "")
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: length {len(b)} != {len(a)}"
        return next((d for d in (same(x, y, f"{where}/{i}") for i, (x, y) in enumerate(zip(a, b))) if d), "")
    if isinstance(a, np.ndarray):
        return "" if a.dtype == b.dtype and np.array_equal(a, b) else f"{where}: numpy array differs"
    if isinstance(a, Thing):
        return same((a.name, a.numbers, a.tensor), (b.name, b.numbers, b.tensor), where + ".thing")
    return "" if a == b else f"{where}: {b!r} != {a!r}"


def export(*args):
    return subprocess.run([RUNNER, "export", *args], capture_output=True, text=True, timeout=120)


def ref(refdir, rank, version):
    with open(os.path.join(refdir, f"saved-r{rank}-v{version}.pkl"), "rb") as f:
        saved = pickle.load(f)
    # (The test's own file, with numpy arrays in it: not a weights-only load.)
    state = torch.load(os.path.join(refdir, f"state-r{rank}-v{version}.pt"), weights_only=False)
    return saved, state


def check_file(check, path, saved, version, rank):
    meta, tensors = read_safetensors(check, path)
    user = tensors.pop(meta.get("ftrun.user_bytes", "?"), None)
    check(user is not None and user[2] == saved["user_bytes"], f"{path}: the user bytes are the rank's")
    check(list(tensors) == saved["order"], f"{path}: tensors in the saved order: {list(tensors)[:5]}...")
    for name, (dt, shape, raw) in saved["tensors"].items():
        got = tensors.get(name)
        check(got == (ST_DTYPES[dt], shape, raw), f"{path}: '{name}' is {dt}{list(shape)} with the bytes saved "
              f"(got {got and got[:2]})")
    check(meta.get("ftrun.version") == str(version) and meta.get("ftrun.rank") == str(rank),
          f"{path}: metadata names the version and rank: {meta}")
    try:
        from safetensors import safe_open
    except ImportError:
        return
    with safe_open(path, framework="pt") as f:  # the reference reader, where installed
        for name in f.keys():
            t = f.get_tensor(name).contiguous().reshape(-1)
            raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
            want = saved["user_bytes"] if name == "__ftrun_user_bytes__" else saved["tensors"][name][2]
            check(raw == want, f"{path}: the safetensors package reads '{name}' with the bytes saved")


@pytest.fixture(scope="module")
def persisted():
    """Section 1: the job whose versions every test exports and loads back. Returns its persist
    directory, the ranks' records of what they saved, the job id and the complete versions on disk."""
    disk = scratch("ftrun-export-")
    refdir = scratch("ftrun-export-ref-")
    job_id = "export-%d" % os.getpid()
    config = (f"job:\n  id: {job_id}\n  max_restarts: 0\nstore:\n  memory_budget: 64MiB\n  chunk_size: 64KiB\n"
              f"persist:\n  dir: {disk}\n  every_versions: 1\n  keep: 5\n")
    job = Job(2, [], config, job_id=job_id, command=[PY, os.path.join(HERE, "py_export_rank.py"), refdir])
    rc = job.wait(120)
    assert rc == 0 and job.log.count("EXPORT RANK OK") == 2, f"the job ends well (exit {rc})\n{job.log[-3000:]}"
    versions = [v["version"] for v in ftrun.persisted_versions(disk, job_id) if v["complete"]]
    print("complete versions on disk:", versions, flush=True)
    return disk, refdir, job_id, versions


def test_versions_on_disk(check, persisted):
    """The last version (3) and an older one are complete on disk."""
    versions = persisted[3]
    check(versions and versions[0] == 3, "the last version (3) is on disk")
    check(len(versions) >= 2, "an older version is on disk too")


def test_export_newest_and_load_back(check, scratch, persisted):
    """Sections 2 and 3: `ftrun export` of the newest version writes what each rank saved (index.json, one
    safetensors file per rank), and read_persisted / load_persisted / load_exported give back the state."""
    disk, refdir, job_id, versions = persisted
    older = versions[-1] if len(versions) >= 2 else None
    out = os.path.join(scratch("ftrun-export-out-"), "a", "b")  # parents are created
    p = export("--persist-dir", disk, "--job", job_id, "--out", out)
    print(p.stdout + p.stderr, flush=True)
    check(p.returncode == 0 and "exported version 3" in p.stdout, f"export exits 0 (got {p.returncode})")
    check("left" not in p.stderr, "no progress line when stderr is not a terminal")
    with open(os.path.join(out, "index.json")) as f:
        index = json.load(f)
    check((index["job"], index["version"], index["world_size"]) == (job_id, 3, 2), f"index.json: {str(index)[:200]}")
    check(sorted(os.listdir(out)) == ["index.json", "rank0.safetensors", "rank1.safetensors"],
          f"one file per rank plus index.json, no tmp files: {os.listdir(out)}")
    for r in range(2):
        saved, state = ref(refdir, r, 3)
        entry = index["ranks"][r]
        check(entry["rank"] == r and entry["file"] == f"rank{r}.safetensors", f"index entry {r}")
        check([(t["name"], t["dtype"], tuple(t["shape"])) for t in entry["tensors"]] ==
              [(n, saved["tensors"][n][0], saved["tensors"][n][1]) for n in saved["order"]],
              f"index.json lists rank {r}'s tensors with dtype and shape")
        check(entry["user_bytes"] == len(saved["user_bytes"]), "index.json gives the user bytes' size")
        check_file(check, os.path.join(out, entry["file"]), saved, 3, r)

        # --- 3. back to the state, with no agent ----------------------------------
        v, tensors, user = ftrun.read_persisted(disk, job_id, rank=r)
        check(v == 3 and user == saved["user_bytes"] and
              {n: a.tobytes() for n, a in tensors.items()} == {n: s[2] for n, s in saved["tensors"].items()},
              "read_persisted: the saved bytes")
        for what, got in (("load_persisted", ftrun.load_persisted(disk, job_id, rank=r)),
                          ("load_exported", ftrun.load_exported(out, rank=r))):
            step, back = got
            diff = same(state, back)
            check(step == 3 and not diff, f"{what} rank {r}: the state saved at step 3 ({diff or step})")
            check(back["nested"]["bf16"].dtype == torch.bfloat16 and isinstance(back["thing"], Thing),
                  f"{what}: bfloat16 and user objects come back")
        if older is not None:
            step, back = ftrun.load_persisted(disk, job_id, version=older, rank=r)
            check(step == older and not same(ref(refdir, r, older)[1], back),
                  f"load_persisted version {older}, rank {r}")


def test_export_older_version_one_rank(check, scratch, persisted):
    """An older version and one rank (--version, --ranks): one file, loadable; the rank left out is refused."""
    disk, refdir, job_id, versions = persisted
    assert len(versions) >= 2, f"an older version is on disk too: {versions}"
    older = versions[-1]
    out2 = scratch("ftrun-export-out2-")  # exists, empty: fine
    p = export("--persist-dir", disk, "--job", job_id, "--version", str(older), "--ranks", "1", "--out", out2)
    check(p.returncode == 0 and sorted(os.listdir(out2)) == ["index.json", "rank1.safetensors"],
          f"--version {older} --ranks 1: one file (exit {p.returncode}) {p.stderr}")
    saved, state = ref(refdir, 1, older)
    check_file(check, os.path.join(out2, "rank1.safetensors"), saved, older, 1)
    step, back = ftrun.load_exported(out2, rank=1)
    check(step == older and not same(state, back), f"load_exported of version {older} rank 1")
    step, back = ftrun.load_exported(os.path.join(out2, "rank1.safetensors"))
    check(step == older and not same(state, back), "load_exported of one .safetensors file")
    try:
        ftrun.load_exported(out2, rank=0)
        check(False, "rank 0 was not exported: load_exported must refuse it")
    except ftrun.Error as e:
        check(e.code == "INVALID_ARGUMENT" and "no rank 0" in e.message, f"load_exported rank 0: {e}")


def test_export_synthetic_trainer(check, scratch):
    """The synthetic C++ trainer's versions export too (opaque user bytes): read_exported equals
    read_persisted, and load_exported refuses a state ftrun.save did not write."""
    syn_disk = scratch("ftrun-export-syn-")
    syn = Job(2, ["--steps", "4", "--state-bytes", "2MiB", "--tensors", "3"], job_id="syn-%d" % os.getpid(),
              config=f"store:\n  memory_budget: 64MiB\n  chunk_size: 256KiB\npersist:\n  dir: {syn_disk}\n")
    check(syn.wait(60) == 0, "synthetic job ends well")
    syn_out = os.path.join(syn_disk, "out")
    p = export("--persist-dir", syn_disk, "--job", syn.job_id, "--out", syn_out)
    check(p.returncode == 0, f"synthetic export: exit {p.returncode} {p.stderr}")
    for r in range(2):
        a, b = ftrun.read_persisted(syn_disk, syn.job_id, rank=r), ftrun.read_exported(syn_out, rank=r)
        check(a.version == b.version and a.user_bytes == b.user_bytes and a.dtypes == b.dtypes and
              {n: x.tobytes() for n, x in a.tensors.items()} == {n: x.tobytes() for n, x in b.tensors.items()},
              f"synthetic rank {r}: read_exported equals read_persisted")
    try:
        ftrun.load_exported(syn_out)
        check(False, "load_exported of a non-ftrun.save state must fail")
    except ftrun.Error as e:
        check(e.code == "INVALID_ARGUMENT", f"load_exported of the synthetic trainer's state: {e.code}")


def test_progress_on_terminal(check, scratch, persisted):
    """Section 4: on a terminal (a pty) the export shows bytes, rate and time left, then its final line."""
    disk, refdir, job_id, versions = persisted
    master, slave = pty.openpty()
    pty_out = scratch("ftrun-export-pty-")
    proc = subprocess.Popen([RUNNER, "export", "--persist-dir", disk, "--job", job_id, "--out", pty_out],
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    stdout = proc.communicate(timeout=60)[0].decode()
    text = seen.decode(errors="replace")
    print("terminal:", repr(text[:200]), flush=True)
    check(proc.returncode == 0 and "export: " in text and " of " in text and "left" in text and "\r" in text,
          "on a terminal: a progress line rewritten in place (bytes done of total, rate, time left)")
    check("exported version 3" in stdout, "the final line after the progress")


def test_corrupt_and_missing_chunks(check, scratch, persisted):
    """Section 5: a corrupt and a missing chunk file: export exits 1 naming the file and leaves nothing
    behind; load_persisted raises CORRUPTION naming it."""
    disk, refdir, job_id, versions = persisted
    bad = scratch("ftrun-export-bad-")
    shutil.copytree(os.path.join(disk, job_id), os.path.join(bad, job_id))
    chunk_dir = os.path.join(bad, job_id, "chunks")
    chunks = sorted((os.path.join(d, f) for d, _, fs in os.walk(chunk_dir) for f in fs), key=os.path.getsize,
                    reverse=True)
    failed = None
    for path in chunks:  # the first chunk file version 3 uses
        with open(path, "r+b") as f:
            f.seek(4096 + 17)
            byte = f.read(1)
            f.seek(4096 + 17)
            f.write(bytes([byte[0] ^ 0x40]))
        bad_out = os.path.join(bad, "out")
        p = export("--persist-dir", bad, "--job", job_id, "--out", bad_out)
        if p.returncode != 0:
            failed = (path, p)
            break
        shutil.rmtree(bad_out)
        with open(path, "r+b") as f:
            f.seek(4096 + 17)
            f.write(byte)
    check(failed is not None, "a flipped byte in a chunk file of version 3 fails the export")
    if failed:
        path, p = failed
        print(p.stderr, flush=True)
        check(p.returncode == 1 and path in p.stderr and "corrupt" in p.stderr, f"exit 1 naming '{path}': {p.stderr}")
        check(not os.path.exists(os.path.join(bad, "out")), "nothing is left of a failed export")
        try:
            for r in range(2):
                ftrun.load_persisted(bad, job_id, rank=r)
            check(False, "load_persisted of a corrupt version must fail")
        except ftrun.Error as e:
            check(e.code == "CORRUPTION" and path in e.message, f"load_persisted: CORRUPTION naming the file: {e}")
        os.unlink(path)
        p = export("--persist-dir", bad, "--job", job_id, "--out", os.path.join(bad, "out"))
        check(p.returncode == 1 and os.path.basename(path) in p.stderr and "missing" in p.stderr,
              f"a missing chunk file: exit 1 naming it: {p.stderr}")


def test_bad_inputs(check, scratch, persisted):
    """Section 6: bad inputs exit 2 naming the path and what was expected, and write nothing; an incomplete
    newer version is skipped by default and refused by name. (Last: it adds an incomplete version.)"""
    disk, refdir, job_id, versions = persisted
    full = scratch("ftrun-export-full-")
    with open(os.path.join(full, "keep.txt"), "w") as f:
        f.write("mine")
    os.makedirs(os.path.join(disk, job_id, "v%020d" % 99))  # a version that is not complete
    fresh = os.path.join(scratch("ftrun-export-none-"), "out")
    cases = [
        (["--persist-dir", disk + "-nope", "--job", job_id, "--out", fresh], [disk + "-nope", "does not exist"]),
        (["--persist-dir", disk, "--job", "nojob", "--out", fresh], ["no job 'nojob'", job_id]),
        (["--persist-dir", disk, "--job", job_id, "--version", "42", "--out", fresh], ["no version 42", "v%020d" % 42]),
        (["--persist-dir", disk, "--job", job_id, "--version", "99", "--out", fresh], ["not complete", "v%020d" % 99]),
        (["--persist-dir", disk, "--job", job_id, "--out", full], [full, "not empty", "keep.txt"]),
        (["--persist-dir", disk, "--job", job_id, "--out", os.path.join(full, "keep.txt")], ["not a directory"]),
        (["--persist-dir", disk, "--job", job_id, "--ranks", "0,5", "--out", fresh], ["'5'", "world size 2"]),
        (["--persist-dir", disk, "--job", job_id, "--world-size", "3", "--out", fresh], ["world size 2", "not 3"]),
        (["--job", job_id, "--out", fresh], ["--persist-dir"]),
    ]
    for args, words in cases:
        p = export(*args)
        check(p.returncode == 2 and all(w in p.stderr for w in words),
              f"{' '.join(args)}: exit 2 naming {words} (got {p.returncode}: {p.stderr.strip()})")
    check(not os.path.exists(fresh) and os.listdir(full) == ["keep.txt"], "bad inputs write nothing")
    p = export("--persist-dir", disk, "--job", job_id, "--out", fresh)
    check(p.returncode == 0 and "exported version 3" in p.stdout, "an incomplete newer version is skipped by default")
    try:
        ftrun.read_persisted(disk, job_id, version=99)
        check(False, "read_persisted of an incomplete version must fail")
    except ftrun.Error as e:
        check(e.code == "FAILED_PRECONDITION" and "not complete" in e.message, f"read_persisted version 99: {e}")
