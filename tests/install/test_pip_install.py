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

import pytest

import install_lib
from ftrun_testlib import scratch
from install_lib import BUILD, HERE, PYTHON, SOURCE, clean_env


class Venv:
    """The venv (its interpreter `vpy`, its site directory `site`), a home directory, and the clean
    environment (`env`) with only the venv's bin/ on PATH."""


@pytest.fixture(scope="module")
def venv():
    v = Venv()
    v.tmp = scratch("ftrun-pip-")
    v.dir = os.path.join(v.tmp, "venv")
    v.home = os.path.join(v.tmp, "home")
    os.makedirs(v.home)
    v.vpy = os.path.join(v.dir, "bin", "python")
    install_lib.run(None, "python3 -m venv --system-site-packages",
                    [PYTHON, "-m", "venv", "--system-site-packages", v.dir])
    pip_env = dict(os.environ, FTRUN_CMAKE_BUILD_DIR=BUILD, PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip_env.pop("PYTHONPATH", None)
    install_lib.run(None, "pip install --no-build-isolation --no-index",
                    [v.vpy, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-cache-dir", SOURCE],
                    timeout=240, env=pip_env, cwd=v.tmp)
    v.env = clean_env(os.path.join(v.dir, "bin"), v.home)
    v.site = os.path.join(v.dir, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    return v


def test_import_from_venv(check, run, venv):
    """`import ftrun` gives the venv's package, its extension loading the libftrun shipped beside it."""
    probe = ("import ftrun, os\n"
             "maps = [l.split()[-1] for l in open('/proc/self/maps') if 'libftrun' in l]\n"
             "print('PACKAGE', os.path.abspath(ftrun.__file__)); print('LIB', maps[0] if maps else None)\n"
             "print('CLIENT', ftrun.Client.__name__)")
    rc, out = run("import ftrun", [venv.vpy, "-c", probe], env=venv.env, cwd=venv.home)
    check("PACKAGE " + os.path.join(venv.site, "ftrun", "__init__.py") in out, "ftrun imported from the venv:\n" + out)
    check("LIB " + os.path.join(venv.site, "ftrun", "libftrun.so.") in out,
          "with the libftrun shipped beside it:\n" + out)


def test_package_version(check, run, venv):
    """The package's version is the project's (CMakeLists.txt's project())."""
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        want = re.search(r"project\(ftrun VERSION ([0-9.]+)", f.read()).group(1)
    rc, out = run("pip show ftrun", [venv.vpy, "-m", "pip", "show", "ftrun"], env=venv.env, cwd=venv.home)
    check("Version: %s\n" % want in out, "the package's version is the project's, %s:\n%s" % (want, out))


def test_console_script(check, run, venv):
    """ftrun-chaos on PATH is the venv's console script, and it runs the harness."""
    chaos = os.path.join(venv.dir, "bin", "ftrun-chaos")
    check(shutil.which("ftrun-chaos", path=venv.env["PATH"]) == chaos,
          "ftrun-chaos on PATH is the venv's console script")
    rc, out = run("ftrun-chaos --help", ["ftrun-chaos", "--help"], env=venv.env, cwd=venv.home)
    check(out.startswith("usage: ftrun-chaos"), "the console script runs the harness:\n" + out[-1500:])


def test_rank_on_venv_ftrun(check, run, venv):
    """A real rank on the venv's interpreter (-I) saves through a real agent, is SIGKILLed, restores version 5
    and finishes; both generations import the venv's ftrun."""
    config = os.path.join(venv.tmp, "ftrun.yaml")
    with open(config, "w") as f:
        f.write("agent:\n  run_dir: %s/run\nstore:\n  memory_budget: 64MiB\n  chunk_size: 256KiB\n" % venv.tmp)
    rc, out = run("a rank on the venv's ftrun", [os.path.join(BUILD, "ftrun-agent"), "--config", config, "--nproc",
                  "1", "--no_python", "--no_local_rank", "--job-id", "install-pip", "--",
                  venv.vpy, "-I", os.path.join(HERE, "py_trainer.py"), "12", "5"], env=venv.env, cwd=venv.home)
    imported = re.findall(r"FTRUN FROM (\S+)", out)
    check(imported == [os.path.join(venv.site, "ftrun")] * 2,
          "both generations import the venv's ftrun (got %s)" % imported)
    check(out.count("RESUMED 5") == 1, "the restarted rank restores version 5, its bytes checked")
    check(out.count("PYTRAINER DONE") == 1, "the rank finishes")
