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

from install_lib import BUILD, HERE, PYTHON, check, clean_env, failures, finish, run, scratch

tmp = scratch("ftrun-install-")
prefix = os.path.join(tmp, "prefix")
home = os.path.join(tmp, "home")
os.makedirs(home)

# 1. Install and look at the layout.
run("cmake --install", ["cmake", "--install", BUILD, "--prefix", prefix])
for rel in ["bin/ftrun", "bin/ftrun-agent", "bin/ftrun-chaos", "bin/ftrun-synthetic", "bin/ftrun-bench",
            "include/ftrun/client.h", "include/ftrun/ftrun.h", "include/ftrun/status.h",
            "lib/cmake/ftrun/ftrunConfig.cmake", "lib/cmake/ftrun/ftrunConfigVersion.cmake",
            "lib/cmake/ftrun/ftrunTargets.cmake", "lib/libftrun.so", "lib/ftrun/python/ftrun/__init__.py",
            "share/ftrun/configs/default.yaml", "share/ftrun/configs/chaos/mixed.yaml"]:
    check(os.path.exists(os.path.join(prefix, rel)), "installed: %s" % rel)
for rel in ["bin/ftrun", "bin/ftrun-agent", "bin/ftrun-chaos"]:
    check(os.access(os.path.join(prefix, rel), os.X_OK), "executable: %s" % rel)
packages = glob.glob(os.path.join(prefix, "lib", "python3*", "*-packages", "ftrun", "__init__.py"))
check(len(packages) == 1, "one ftrun package in the prefix's site directory (found %s)" % packages)
site = os.path.dirname(os.path.dirname(packages[0])) if packages else os.path.join(prefix, "missing")
check(glob.glob(os.path.join(site, "ftrun", "_ftrun*.so")) != [], "the extension next to the package")
check(os.path.exists(os.path.join(site, "ftrun_chaos", "cli.py")), "the chaos harness beside it")

# 2. A C++ trainer built against the install tree with find_package(ftrun).
consumer_src = os.path.join(HERE, "consumer")
consumer_build = os.path.join(tmp, "consumer-build")
generator = ["-G", "Ninja"] if shutil.which("ninja") else []
run("consumer: configure", ["cmake", "-S", consumer_src, "-B", consumer_build, *generator,
                            "-DCMAKE_PREFIX_PATH=" + prefix])
run("consumer: build", ["cmake", "--build", consumer_build])
consumer = os.path.join(consumer_build, "consumer")
agent_path = ""
if os.path.exists(os.path.join(consumer_build, "agent_path.txt")):
    agent_path = open(os.path.join(consumer_build, "agent_path.txt")).read().strip()
check(agent_path == os.path.join(prefix, "bin", "ftrun-agent"),
      "ftrun::agent names the installed ftrun-agent (got %r)" % agent_path)
rc, out = run("consumer: a version the install is not", ["cmake", "-S", consumer_src, "-B",
              os.path.join(tmp, "consumer-0.2"), *generator, "-DCMAKE_PREFIX_PATH=" + prefix,
              "-DFTRUN_WANT_VERSION=0.2"], expect_rc=None)
check(rc != 0 and "0.1.0" in out, "find_package(ftrun 0.2) refuses the installed 0.1.0:\n" + out[-1500:])

# 3. From a clean environment, by the installed names.
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

# 4. Real jobs, each rank killed once, from the install tree only.
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
if failures:
    print(out[-4000:])

finish(tmp)
