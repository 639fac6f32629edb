"""Checks integration/chaos/ftrun_chaos/report.py on synthetic chaos results.

Run from anywhere: python3 -m pytest tests/unit_py/test_chaos_report.py
"""
import json
import os
import random
import struct

import pytest

from ftrun_chaos import report

KINDS = ["rank_kill", "rank_hang", "agent_kill", "node_kill", "coordinator_kill",
         "link_down", "partition", "packet_loss", "delay", "disk_full",
         "disk_error", "bitflip_shm", "bitflip_disk"]
PHASES = ["detect", "stop", "respawn", "restore", "first step"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_result(n_faults, n_recoveries, verdict="pass", seed=7):
    """A synthetic result dict shaped like the harness's."""
    rng = random.Random(seed)
    duration = 20.0 + n_faults * 0.25
    recoveries = []
    for i in range(n_recoveries):
        detected = duration * (i + 0.5) / max(n_recoveries, 1)
        breakdown = {p: round(rng.uniform(10, 300), 1) for p in PHASES}
        total = sum(breakdown.values())
        recoveries.append({"epoch": i + 1, "reason": f"rank {i % 8} exited (signal 9) | pipe" + "x" * (i % 3 * 60),
                           "detected_s": detected, "first_step_s": detected + total / 1000.0,
                           "total_ms": total, "restored_version": 10 * i,
                           "breakdown_ms": breakdown, "faults": []})
    faults = []
    for i in range(n_faults):
        kind = KINDS[i % len(KINDS)]
        at = duration * i / max(n_faults, 1)
        rec = i % n_recoveries if n_recoveries and i % 3 == 0 else None
        faults.append({"id": i, "kind": kind, "target": f"node {i % 4} rank {i % 8}",
                       "params": {"signal": "SIGKILL"} if kind == "rank_kill" else {"loss": "5%|burst"},
                       "at_s": at, "at_step": int(at * 10),
                       "ended_s": at + 1.5 if kind in ("link_down", "partition", "delay") else None,
                       "recovery": rec,
                       "detected": (i % 2 == 0) if kind.startswith("bitflip") else None, "note": ""})
    by_kind = {}
    for f in faults:
        by_kind[f["kind"]] = by_kind.get(f["kind"], 0) + 1
    steps = [[round(t * 0.05, 3), t] for t in range(int(duration * 20))]
    checks = [{"name": "job completed", "ok": True, "detail": "runner exit 0"},
              {"name": "losses match | reference", "ok": verdict == "pass",
               "detail": "all equal" if verdict == "pass" else "step 412: 2.31 != 2.30"}]
    if verdict == "fail":
        checks.append({"name": "bitflips detected", "ok": False, "detail": "fault 12 undetected"})
    return {"version": 1, "plan": "configs/chaos/soak.yaml", "seed": seed, "verdict": verdict,
            "checks": checks,
            "cluster": {"backend": "netns", "nodes": 4, "spares": 1, "ranks_per_node": 2,
                        "replicas": 1, "persist_dir": "/run/ftrun-chaos"},
            "job": {"command": ["ftrun-synthetic", "--steps", "3000"], "exit_code": 0 if verdict == "pass" else 1,
                    "steps": len(steps), "duration_s": duration},
            "faults": faults, "recoveries": recoveries, "steps": steps,
            "committed": [[t + 0.02, max(s - 1, 0)] for t, s in steps[::5]],
            "summary": {"faults_planned": n_faults + 3, "faults_injected": n_faults, "by_kind": by_kind,
                        "recoveries": n_recoveries,
                        "recovery_s": {"median": 0.9, "p95": 2.1, "max": 3.0} if n_recoveries else
                        {"median": None, "p95": None, "max": None}}}


def sparse_result():
    """Almost every field missing or None."""
    return {"version": 1, "plan": None, "seed": None, "verdict": "fail",
            "checks": [{"name": "job completed", "ok": False, "detail": None}],
            "cluster": None, "job": None,
            "faults": [{"id": 0, "kind": "rank_hang", "at_s": None, "recovery": 5},
                       {"id": 1, "kind": None, "at_s": 3.0, "ended_s": None}],
            "recoveries": [{"epoch": 1, "detected_s": 3.1, "first_step_s": None, "total_ms": 400.0,
                            "breakdown_ms": None},
                           {"epoch": 2, "detected_s": None, "breakdown_ms": {"detect": 5.0}}],
            "steps": [[0.1, 1], [None, 2], [0.3]], "committed": None, "summary": None}


def png_size(path):
    """(width, height) from the IHDR chunk, or None when not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def check_files(check, name, result, out_dir):
    """The three files exist, JSON round-trips, PNG is a big enough PNG; returns the Markdown."""
    paths = report.write_reports(result, out_dir)
    check(set(paths) == {"json", "markdown", "png"}, f"{name}: returned keys {sorted(paths)}")
    for key, path in paths.items():
        check(os.path.isfile(path), f"{name}: {key} file {path} missing")
    check(not [p for p in os.listdir(out_dir) if p.startswith(".tmp")], f"{name}: temporary files left")
    with open(paths["json"], encoding="utf-8") as f:
        check(json.load(f) == result, f"{name}: report.json does not round-trip")
    size = png_size(paths["png"])
    check(size is not None and size[0] >= 600 and size[1] >= 400, f"{name}: PNG size {size}")
    with open(paths["markdown"], encoding="utf-8") as f:
        return f.read()


def check_markdown(check, name, result, md):
    """Verdict, check names, kind counts, escaped pipes, well-formed tables."""
    verdict = result["verdict"].upper()
    check(md.splitlines()[0].startswith("#") and verdict in md.splitlines()[0],
          f"{name}: title line lacks {verdict}")
    for c in result["checks"]:
        check(c["name"].replace("|", "\\|") in md, f"{name}: check {c['name']!r} missing")
    for kind, count in result["summary"]["by_kind"].items():
        check(f"| {kind} | {count} |" in md, f"{name}: count of {kind} missing")
    check("timeline.png" in md, f"{name}: no link to timeline.png")
    for line in md.splitlines():
        if line.startswith("|"):
            cells = line.replace("\\|", "").count("|")
            check(cells >= 3, f"{name}: odd table row {line[:60]!r}")
    check(" | pipe" not in md, f"{name}: unescaped pipe in a cell")
    why = md.find("## Why it failed")
    if result["verdict"] == "fail":
        failed = [c for c in result["checks"] if not c["ok"]]
        check(why >= 0, f"{name}: no 'Why it failed' section")
        section = md[why:md.find("\n## ", why + 1)]
        for c in failed:
            check(c["name"].replace("|", "\\|") in section and c["detail"].replace("|", "\\|") in section,
                  f"{name}: failed check {c['name']!r} not under 'Why it failed'")
        check(why < md.find("## Checks"), f"{name}: 'Why it failed' is not before the checks")
    else:
        check(why < 0, f"{name}: 'Why it failed' in a passing report")


def check_summary(check, name, result):
    """format_summary names the verdict and every failed check."""
    text = report.format_summary(result)
    check(result["verdict"].upper() in text, f"{name}: summary lacks the verdict")
    for c in result["checks"]:
        if not c["ok"]:
            check(c["name"] in text and (c["detail"] is None or c["detail"] in text),
                  f"{name}: summary lacks failed check {c['name']!r}")


CASES = {"pass": (40, 12, "pass", 7), "fail": (30, 8, "fail", 7), "no faults": (0, 0, "pass", 7),
         "1200 faults": (1200, 400, "pass", 11)}


@pytest.mark.parametrize("name", list(CASES))
def test_report(check, scratch, name):
    """The three files (JSON that round-trips, a big enough PNG, Markdown with the verdict, checks, counts and
    escaped pipes) and the summary, for a result of this shape."""
    n_faults, n_recoveries, verdict, seed = CASES[name]
    result = make_result(n_faults, n_recoveries, verdict=verdict, seed=seed)
    out_dir = os.path.join(scratch("ftrun-chaos-report-"), "nested")  # created by write_reports
    md = check_files(check, name, result, out_dir)
    check_markdown(check, name, result, md)
    check_summary(check, name, result)


def test_sparse_result(check, scratch):
    """A result with almost every field missing or None still gives the files, a FAIL verdict and the
    failure section."""
    md = check_files(check, "sparse", sparse_result(), os.path.join(scratch("ftrun-chaos-report-"), "sparse"))
    check("## Why it failed" in md and "FAIL" in md, "sparse: verdict or failure section missing")
    check_summary(check, "sparse", sparse_result())


def test_rewrite_same_directory(check, scratch):
    """Reports written again into a directory that holds some: no temporary files, and the new content."""
    result = make_result(0, 0)
    out_dir = os.path.join(scratch("ftrun-chaos-report-"), "nested")
    check_files(check, "no faults", result, out_dir)
    md = check_files(check, "no faults again", result, out_dir)
    check("No faults were injected." in md, "no faults: missing 'No faults were injected.'")


def test_summary_lists_faults_not_injected_apart(check):
    """Issue 33, finding 12: faults the schedule could not place (the job finished first) are listed in the
    summary as the schedule's, not as a failed check."""
    result = {"verdict": "pass", "plan": "mixed.yaml", "seed": 1,
              "checks": [{"name": "the plan's faults were injected", "ok": True, "detail": "56 of 57"}],
              "faults": [], "recoveries": [], "summary": {"faults_injected": 56, "faults_planned": 57},
              "not_injected": ["1 random faults: the job ended or did not recover (stopped)"]}
    text = report.format_summary(result)
    check("PASS" in text and "failed checks" not in text, text)
    check("not injected (the schedule, not a failure): 1: 1 random faults" in text, text)
