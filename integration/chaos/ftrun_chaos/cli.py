"""ftrun-chaos --plan PLAN [--faults N | --duration D] [--seed S] [--out DIR]

Exit codes: 0 the run passed every check, 1 it failed one (the report says
which), 2 bad input (plan, options) or a machine that cannot run it."""
import argparse
import os
import shutil
import signal
import sys
import threading
import time

from . import plan as planlib
from .netns_cluster import available
from .run import RunError, execute, scaled


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _take_signals():
    """SIGTERM, SIGINT and SIGHUP unwind the run (the runner is stopped before the namespaces go);
    installed once the cluster exists, over netns_cluster's own handlers."""
    def handler(signum, frame):
        raise Interrupted(signum)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, handler)


def _build_dir(arg):
    if arg:
        return arg
    env = os.environ.get("FTRUN_BUILD_DIR")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    if os.path.exists(os.path.join(here, "ftrun")):
        return here  # the build tree's link, or `cmake --install`'s bin/
    source_build = os.path.join(os.path.dirname(__file__), "..", "..", "..", "build")
    if os.path.exists(os.path.join(source_build, "ftrun")):
        return source_build  # run from a source checkout
    on_path = shutil.which("ftrun")  # a `pip install`ed ftrun-chaos, the programs installed by CMake
    return os.path.dirname(os.path.realpath(on_path)) if on_path else source_build


def main(argv=None):
    ap = argparse.ArgumentParser(prog="ftrun-chaos", description="Break a running ftrun cluster on purpose and "
                                 "check that the job survives with nothing lost.")
    ap.add_argument("--plan", required=True, help="the plan (YAML; see configs/chaos/)")
    ap.add_argument("--faults", type=int, help="this many random faults (long mode; the plan needs 'random')")
    ap.add_argument("--duration", help="random faults until this long has passed, e.g. 2h (long mode)")
    ap.add_argument("--seed", type=int, help="the random section's seed (replays a run)")
    ap.add_argument("--out", help="where the report goes (default: chaos-<time>/ here)")
    ap.add_argument("--build", help="the directory with ftrun, ftrun-agent, ftrun-synthetic (default: next "
                    "to this command, else the source tree's build/, else the ftrun on PATH)")
    ap.add_argument("--quiet", action="store_true", help="only the summary")
    a = ap.parse_args(argv)
    lock = threading.Lock()  # faults fired together log from their own threads

    def log(message):
        if not a.quiet:
            with lock:
                print("ftrun-chaos: " + message, flush=True)
    try:
        plan = planlib.load(a.plan)
        if a.faults is not None and a.faults < 1:
            raise planlib.PlanError("--faults: expected a number of faults >= 1, got %d" % a.faults)
        duration = None
        if a.duration is not None:
            duration = planlib.parse_duration(a.duration)
            if not duration:
                raise planlib.PlanError("--duration: expected a duration like 30m or 2h, got %r" % a.duration)
        if a.seed is not None:
            plan.seed = a.seed
        plan = scaled(plan, a.faults, duration)
    except (planlib.PlanError, RunError) as e:
        print("ftrun-chaos: %s" % e, file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401  (the report's figure: missing, say so before the run, not after it)
    except ImportError:
        print("ftrun-chaos: the report needs matplotlib (apt-get install python3-matplotlib, "
              "or pip install 'ftrun[chaos]')", file=sys.stderr)
        return 2
    build = _build_dir(a.build)
    for tool in ("ftrun", "ftrun-agent", "ftrun-synthetic"):
        if not os.access(os.path.join(build, tool), os.X_OK):
            print("ftrun-chaos: %s/%s not found (build first, or pass --build)" % (build, tool), file=sys.stderr)
            return 2
    ok, why = available() if plan.backend == "netns" else (True, "")
    if not ok:
        print("ftrun-chaos: cannot build network-namespace nodes here: %s" % why, file=sys.stderr)
        return 2
    out = a.out or "chaos-%s" % time.strftime("%Y%m%d-%H%M%S")
    try:
        result = execute(plan, build, out, log, duration, on_cluster=_take_signals)
    except RunError as e:
        print("ftrun-chaos: %s" % e, file=sys.stderr)
        return 2
    except Interrupted as e:
        print("ftrun-chaos: stopped by %s; the job and the namespaces are gone" % e, file=sys.stderr)
        return 128 + e.signum
    from .report import format_summary, write_reports  # matplotlib only once there is something to draw
    paths = write_reports(result, out)
    print(format_summary(result))
    print("ftrun-chaos: report: %s, %s, %s" % (paths["markdown"], paths["json"], paths["png"]))
    return 0 if result["verdict"] == "pass" else 1
