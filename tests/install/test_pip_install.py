"""`pip install --no-build-isolation --no-index .` into a fresh venv (with
the system's site packages, so Debian's numpy, PyYAML and setuptools serve,
offline), then from that venv only, in a clean environment: `import ftrun`
(the venv's package, its extension loading the libftrun shipped beside
it), the `ftrun-chaos` console script, the package version, and a real rank
(the venv's interpreter with -I: no PYTHONPATH can lend it another ftrun)
that saves through a real agent, is SIGKILLed, restores and finishes.

The extension comes from this checkout's build tree (FTRUN_CMAKE_BUILD_DIR,
see setup.py), so the test does not compile it a second time."""
import os
import re
import shutil
import sys

from install_lib import BUILD, HERE, PYTHON, SOURCE, check, clean_env, finish, run, scratch

tmp = scratch("ftrun-pip-")
venv = os.path.join(tmp, "venv")
home = os.path.join(tmp, "home")
os.makedirs(home)
vpy = os.path.join(venv, "bin", "python")

run("python3 -m venv --system-site-packages", [PYTHON, "-m", "venv", "--system-site-packages", venv])
pip_env = dict(os.environ, FTRUN_CMAKE_BUILD_DIR=BUILD, PIP_DISABLE_PIP_VERSION_CHECK="1")
pip_env.pop("PYTHONPATH", None)
run("pip install --no-build-isolation --no-index", [vpy, "-m", "pip", "install", "--no-build-isolation",
    "--no-index", "--no-cache-dir", SOURCE], timeout=240, env=pip_env, cwd=tmp)

env = clean_env(os.path.join(venv, "bin"), home)
site = os.path.join(venv, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
probe = ("import ftrun, os\n"
         "maps = [l.split()[-1] for l in open('/proc/self/maps') if 'libftrun' in l]\n"
         "print('PACKAGE', os.path.abspath(ftrun.__file__)); print('LIB', maps[0] if maps else None)\n"
         "print('CLIENT', ftrun.Client.__name__)")
rc, out = run("import ftrun", [vpy, "-c", probe], env=env, cwd=home)
check("PACKAGE " + os.path.join(site, "ftrun", "__init__.py") in out, "ftrun imported from the venv:\n" + out)
check("LIB " + os.path.join(site, "ftrun", "libftrun.so.") in out, "with the libftrun shipped beside it:\n" + out)

with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
    want = re.search(r"project\(ftrun VERSION ([0-9.]+)", f.read()).group(1)
rc, out = run("pip show ftrun", [vpy, "-m", "pip", "show", "ftrun"], env=env, cwd=home)
check("Version: %s\n" % want in out, "the package's version is the project's, %s:\n%s" % (want, out))

chaos = os.path.join(venv, "bin", "ftrun-chaos")
check(shutil.which("ftrun-chaos", path=env["PATH"]) == chaos, "ftrun-chaos on PATH is the venv's console script")
rc, out = run("ftrun-chaos --help", ["ftrun-chaos", "--help"], env=env, cwd=home)
check(out.startswith("usage: ftrun-chaos"), "the console script runs the harness:\n" + out[-1500:])

config = os.path.join(tmp, "ftrun.yaml")
with open(config, "w") as f:
    f.write("agent:\n  run_dir: %s/run\nstore:\n  memory_budget: 64MiB\n  chunk_size: 256KiB\n" % tmp)
rc, out = run("a rank on the venv's ftrun", [os.path.join(BUILD, "ftrun-agent"), "--config", config, "--nproc", "1",
              "--no_python", "--no_local_rank", "--job-id", "install-pip", "--",
              vpy, "-I", os.path.join(HERE, "py_trainer.py"), "12", "5"], env=env, cwd=home)
imported = re.findall(r"FTRUN FROM (\S+)", out)
check(imported == [os.path.join(site, "ftrun")] * 2, "both generations import the venv's ftrun (got %s)" % imported)
check(out.count("RESUMED 5") == 1, "the restarted rank restores version 5, its bytes checked")
check(out.count("PYTRAINER DONE") == 1, "the rank finishes")

finish(tmp)
