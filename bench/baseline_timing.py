"""What `ftrun-bench baseline-torch` reads from its ranks: the TIMING and
FIRSTSTEP lines every rank prints (integration/examples/train_gpt.py's
docstring), the restarted generation's moments at the slowest rank and the
segments between them, the save stalls, and the figures of one side."""
import re
import statistics

TIMING_RE = re.compile(r"^TIMING (\d+) (\S+) (\S+)(?: (\d+))?$", re.M)
FIRSTSTEP_RE = re.compile(r"^FIRSTSTEP (\d+) (\S+) (\S+)$", re.M)


def parse(text):
    """TIMING lines -> {rank: {name: [values in order]}}, save lines -> {rank: [(step, stall)]},
    FIRSTSTEP -> {rank: mono}."""
    timing, saves, first = {}, {}, {}
    for r, name, value, step in TIMING_RE.findall(text):
        r = int(r)
        timing.setdefault(r, {}).setdefault(name, []).append(float(value))
        if name == "save_stall_s":
            saves.setdefault(r, []).append((int(step), float(value)))
    for r, _unix, mono in FIRSTSTEP_RE.findall(text):
        first[int(r)] = float(mono)
    return timing, saves, first


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def timeline(t_kill, timing, world, warm=False):
    """The restarted generation's moments at the slowest rank, and the segments between them. warm: the
    ranks ran again in processes that existed before the kill (@ftrun.resilient): their t_imported is the
    moment the training function began again, and there is no start-up."""
    def last(name):
        vals = [timing[r][name][-1] for r in range(world) if name in timing.get(r, {})]
        return max(vals) if len(vals) == world else None

    names = ("t_imported", "t_setup", "t_restored", "t_first_step") if warm else (
        "t_start", "t_imported", "t_setup", "t_restored", "t_first_step")
    stamps = {k: last(k) for k in names}
    missing = [k for k, v in stamps.items() if v is None]
    if missing:
        raise RuntimeError(f"not every rank printed {', '.join(missing)}")
    if warm:
        seg = {"kill_to_generation_s": stamps["t_imported"] - t_kill}
    else:
        seg = {"kill_to_spawned_s": stamps["t_start"] - t_kill,
               "startup_and_import_s": stamps["t_imported"] - stamps["t_start"]}
    seg.update({
        "setup_s": stamps["t_setup"] - stamps["t_imported"],
        "restore_s": stamps["t_restored"] - stamps["t_setup"],
        "first_step_s": stamps["t_first_step"] - stamps["t_restored"],
        "ready_s": stamps["t_restored"] - t_kill,  # every rank ready to step: the recovery without its first step
        "total_s": stamps["t_first_step"] - t_kill,
    })
    per_rank = {}
    for name in ("import_s", "restore_load_s", "startup_s", "setup_s", "restore_s", "first_step_s",
                 "first_step_compute_s", "first_step_sync_s", "first_step_opt_s", "restore_minflt",
                 "first_step_minflt", "t_restored"):
        per_rank[name] = [timing.get(r, {}).get(name, [None])[-1] for r in range(world)]
    return {"segments": seg, "per_rank": per_rank}


def stalls(saves_by_gen, world, key="save_stall_s"):
    """Every save's stall but each process's first (file creation, arena set-up, first touch)."""
    out = []
    for timing in saves_by_gen:
        for r in range(world):
            out.extend(timing.get(r, {}).get(key, [])[1:])
    return out


def summary(side):
    recs = side["recoveries"]

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    def slowest(name):  # per recovery, the slowest rank; the median over recoveries
        return med([max((x for x in r["per_rank"][name] if x is not None), default=None) for r in recs])

    out = {
        "save_stall_s": med(side["save_stall_s"]),
        "save_stall_samples": len(side["save_stall_s"]),
        "restore_s": slowest("restore_s"),
        "restore_load_s": slowest("restore_load_s"),
        "recovery_s": med([r["segments"]["total_s"] for r in recs]),
        "ready_s": med([r["segments"]["ready_s"] for r in recs]),
        "victim_exit_s": med([r.get("victim_exit_s") for r in recs]),
        "import_s": slowest("import_s"),
        "startup_s": slowest("startup_s"),
        "first_step_s": slowest("first_step_s"),
    }
    for seg in ("kill_to_spawned_s", "startup_and_import_s", "kill_to_generation_s", "setup_s", "restore_s",
                "first_step_s"):
        if all(seg in r["segments"] for r in recs):
            out["segment_" + seg] = med([r["segments"][seg] for r in recs])
    if all("startup_and_import_s" in r["segments"] for r in recs):
        out["startup_and_import_share"] = med([r["segments"]["startup_and_import_s"] / r["segments"]["total_s"]
                                               for r in recs])
    if all("survivor_restore_s" in r for r in recs):  # warm: the survivors' own figures
        out["survivor_restore_s"] = med([r["survivor_restore_s"] for r in recs])
        out["survivor_ready_s"] = med([r["survivor_ready_s"] for r in recs])
    if "save_write_s" in side:
        out["save_write_s"] = med(side["save_write_s"])
        out["save_fsync_s"] = med(side["save_fsync_s"])
    agents = [r["agents"] for r in recs if r.get("agents")]
    if agents:  # the agents' breakdown: per recovery the slowest agent, the median over recoveries
        for part in ("detect_ms", "stop_ms", "respawn_ms", "connect_ms", "restore_ms", "first_step_ms"):
            out["agent_" + part] = med([max(a.get(part, 0) for a in ags) for ags in agents])
    return out
