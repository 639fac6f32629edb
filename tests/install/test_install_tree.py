"""`cmake --install` into a fresh prefix, then only the install tree:

* the layout (programs, libftrun, headers, find_package files, the Python
  package, the chaos harness, the configs);
* a C++ trainer built against it with find_package(ftrun) (and a version the
  install does not have refused);
* from a clean environment (PATH=<prefix>/bin:/usr/bin:/bin, no PYTHONPATH, no
  LD_LIBRARY_PATH): `ftrun --help`, `ftrun-agent --help`, `ftrun-chaos
  --help`; `import ftrun` with the prefix's site directory on PYTHONPATH (a
  prefix other than /usr/local is not on the interpreter's path: Python's
  rule, docs/install.md), its extension loading the installed libftrun;
* two real jobs with a SIGKILL each: the installed ftrun-agent running the
  C++ trainer, and the installed `ftrun` runner (2 nodes) running a Python
  trainer that imports ftrun with no PYTHONPATH set. Both restore the
  committed version, check its bytes, and finish."""
import glob
import os
import re
import shutil

import pytest

import install_lib
from ftrun_testlib import scratch
from install_lib import BUILD, HERE, PYTHON, clean_env

CONSUMER_SRC = os.path.join(HERE, "consumer")
GENERATOR = ["-G", "Ninja"] if shutil.which("ninja") else []


class Tree:
    """The install prefix, a home directory, and the prefix's site directory."""


@pytest.fixture(scope="module")
def tree():
    """1. `cmake --install` into a fresh prefix."""
    t = Tree()
    t.tmp = scratch("ftrun-install-")
    t.prefix = os.path.join(t.tmp, "prefix")
    t.home = os.path.join(t.tmp, "home")
    os.makedirs(t.home)
    install_lib.run(None, "cmake --install", ["cmake", "--install", BUILD, "--prefix", t.prefix])
    t.packages = glob.glob(os.path.join(t.prefix, "lib", "python3*", "*-packages", "ftrun", "__init__.py"))
    t.site = os.path.dirname(os.path.dirname(t.packages[0])) if t.packages else os.path.join(t.prefix, "missing")
    return t


@pytest.fixture(scope="module")
def consumer(tree):
    """2. A C++ trainer built against the install tree with find_package(ftrun): its build directory."""
    consumer_build = os.path.join(tree.tmp, "consumer-build")
    install_lib.run(None, "consumer: configure", ["cmake", "-S", CONSUMER_SRC, "-B", consumer_build, *GENERATOR,
                                                  "-DCMAKE_PREFIX_PATH=" + tree.prefix])
    install_lib.run(None, "consumer: build", ["cmake", "--build", consumer_build])
    return consumer_build


def test_layout(check, tree):
    """Programs, libftrun, headers, find_package files, the Python package with its extension, the chaos
    harness and the configs are installed."""
    prefix, packages, site = tree.prefix, tree.packages, tree.site
    for rel in ["bin/ftrun", "bin/ftrun-agent", "bin/ftrun-chaos", "bin/ftrun-synthetic", "bin/ftrun-bench",
                "include/ftrun/client.h", "include/ftrun/ftrun.h", "include/ftrun/status.h",
                "lib/cmake/ftrun/ftrunConfig.cmake", "lib/cmake/ftrun/ftrunConfigVersion.cmake",
                "lib/cmake/ftrun/ftrunTargets.cmake", "lib/libftrun.so", "lib/ftrun/python/ftrun/__init__.py",
                "share/ftrun/configs/default.yaml", "share/ftrun/configs/chaos/mixed.yaml"]:
        check(os.path.exists(os.path.join(prefix, rel)), "installed: %s" % rel)
    for rel in ["bin/ftrun", "bin/ftrun-agent", "bin/ftrun-chaos"]:
        check(os.access(os.path.join(prefix, rel), os.X_OK), "executable: %s" % rel)
    check(len(packages) == 1, "one ftrun package in the prefix's site directory (found %s)" % packages)
    check(glob.glob(os.path.join(site, "ftrun", "_ftrun*.so")) != [], "the extension next to the package")
    check(os.path.exists(os.path.join(site, "ftrun_chaos", "cli.py")), "the chaos harness beside it")


def test_find_package(check, run, tree, consumer):
    """ftrun::agent names the installed ftrun-agent, and find_package(ftrun 0.2) refuses the installed 0.1.0."""
    prefix, tmp, consumer_build = tree.prefix, tree.tmp, consumer
    agent_path = ""
    if os.path.exists(os.path.join(consumer_build, "agent_path.txt")):
        agent_path = open(os.path.join(consumer_build, "agent_path.txt")).read().strip()
    check(agent_path == os.path.join(prefix, "bin", "ftrun-agent"),
          "ftrun::agent names the installed ftrun-agent (got %r)" % agent_path)
    rc, out = run("consumer: a version the install is not", ["cmake", "-S", CONSUMER_SRC, "-B",
                  os.path.join(tmp, "consumer-0.2"), *GENERATOR, "-DCMAKE_PREFIX_PATH=" + prefix,
                  "-DFTRUN_WANT_VERSION=0.2"], expect_rc=None)
    check(rc != 0 and "0.1.0" in out, "find_package(ftrun 0.2) refuses the installed 0.1.0:\n" + out[-1500:])


def test_clean_environment(check, run, tree):
    """3. From a clean environment, by the installed names: each program's --help, and `import ftrun` from
    the prefix's site directory, its extension loading the installed libftrun."""
    prefix, home, site = tree.prefix, tree.home, tree.site
    env = clean_env(os.path.join(prefix, "bin"), home)
    for prog, want in [("ftrun", "Usage: ftrun"), ("ftrun-agent", "Usage: ftrun-agent"),
                       ("ftrun-chaos", "usage: ftrun-chaos")]:
        found = shutil.which(prog, path=env["PATH"])
        check(found == os.path.join(prefix, "bin", prog), "%s on PATH is the installed one (%s)" % (prog, found))
        rc, out = run(prog + " --help", [prog, "--help"], env=env, cwd=home)
        check(want in out, "%s --help prints its usage:\n%s" % (prog, out[-1500:]))
    probe = ("import ftrun, os\n"
             "maps = [l.split()[-1] for l in open('/proc/self/maps') if 'libftrun' in l]\n"
             "print('PACKAGE', os.path.abspath(ftrun.__file__)); print('LIB', maps[0] if maps else None)\n"
             "print('CLIENT', ftrun.Client.__name__)")
    rc, out = run("import ftrun", [PYTHON, "-c", probe], env=dict(env, PYTHONPATH=site), cwd=home)
    check("PACKAGE " + os.path.join(site, "ftrun", "__init__.py") in out, "ftrun imported from the install:\n" + out)
    check("LIB " + os.path.join(prefix, "lib", "libftrun.so.") in out,
          "its extension loads the installed libftrun (RPATH, no LD_LIBRARY_PATH):\n" + out)


def test_real_jobs(check, run, tree, consumer):
    """4. Two real jobs with a SIGKILL each, from the install tree only: the installed agent with the C++
    trainer, and the installed runner (2 nodes) with a Python trainer importing ftrun with no PYTHONPATH."""
    prefix, home, tmp = tree.prefix, tree.home, tree.tmp
    consumer = os.path.join(consumer, "consumer")
    env = clean_env(os.path.join(prefix, "bin"), home)
    config = os.path.join(tmp, "ftrun.yaml")
    with open(config, "w") as f:
        f.write("agent:\n  run_dir: %s/run\nstore:\n  memory_budget: 64MiB\n  chunk_size: 256KiB\n" % tmp)
    rc, out = run("ftrun-agent with the C++ trainer", ["ftrun-agent", "--config", config, "--nproc", "2",
                  "--no_python", "--no_local_rank", "--job-id", "install-cxx", "--", consumer, "30", "12"],
                  env=env, cwd=home)
    check("restoring version 12" in out, "the agent restores the committed version 12 after the kill")
    check(out.count("RESUMED 12") == 2, "both ranks resume from version 12, its bytes checked")
    check(out.count("CONSUMER DONE") == 2, "both ranks finish")
    check("backwards save: FAILED_PRECONDITION" in out, "an expected failure comes back as a Status")

    trainer = os.path.join(HERE, "py_trainer.py")
    rc, out = run("ftrun (2 nodes) with the Python trainer", ["ftrun", "--num_nodes", "2", "--num_gpus", "1",
                  "--config", config, trainer, "20", "8"], env=env, cwd=home)
    rank_dir = os.path.join(prefix, "lib", "ftrun", "python", "ftrun")
    imported = re.findall(r"FTRUN FROM (\S+)", out)
    check(imported == [rank_dir] * 4, "every rank, both generations, imports the installed ftrun with no PYTHONPATH "
          "set, from %s (got %s)" % (rank_dir, imported))
    check(out.count("RESUMED 8") == 2, "both ranks resume from version 8, its bytes checked")
    check(out.count("PYTRAINER DONE") == 2, "both ranks finish")
    if check.failures:
        print(out[-4000:])
