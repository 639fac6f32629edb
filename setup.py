"""Builds ftrun's Python extension for `pip install --no-build-isolation .`
(pyproject.toml holds the rest of the package's description).

The extension `ftrun._ftrun` is built by CMake from this checkout's
CMakeLists.txt (target _ftrun) and installed with its `python` and `library`
components into a staging prefix; the extension and libftrun (its RPATH
starts with $ORIGIN) are then copied into the wheel's ftrun/ directory.

FTRUN_CMAKE_BUILD_DIR=DIR reuses a build tree of this checkout that is
configured already (e.g. build/), instead of configuring a fresh one under
build/pip/; CMAKE_ARGS adds arguments to a fresh configure."""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
PIP_BUILD = os.path.join("build", "pip")  # setuptools' own files, inside the ignored build/


def project_version():
    path = os.path.join(ROOT, "CMakeLists.txt")
    with open(path) as f:
        m = re.search(r"project\(ftrun VERSION ([0-9]+\.[0-9]+\.[0-9]+)", f.read())
    if not m:
        raise RuntimeError("%s: expected `project(ftrun VERSION X.Y.Z ...)`, the package's version" % path)
    return m.group(1)


def cache_values(build_dir):
    path = os.path.join(build_dir, "CMakeCache.txt")
    values = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"^([A-Za-z0-9_]+):[A-Z]+=(.*)$", line.rstrip("\n"))
            if m:
                values[m.group(1)] = m.group(2)
    return values


class CMakeBuild(build_ext):
    def run_cmake(self, *args):
        print("setup.py: cmake " + " ".join(shlex.quote(a) for a in args), flush=True)
        subprocess.run(["cmake", *args], check=True)

    def cmake_tree(self):
        given = os.environ.get("FTRUN_CMAKE_BUILD_DIR")
        if given:
            build_dir = os.path.abspath(given)
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                raise RuntimeError("FTRUN_CMAKE_BUILD_DIR=%s: expected a configured CMake build tree "
                                   "(no CMakeCache.txt there)" % given)
            cache = cache_values(build_dir)
            home = cache.get("CMAKE_HOME_DIRECTORY", "")
            if os.path.realpath(home) != os.path.realpath(ROOT):
                raise RuntimeError("FTRUN_CMAKE_BUILD_DIR=%s: expected a build tree of %s, it builds %s"
                                   % (given, ROOT, home))
            if cache.get("FTRUN_BUILD_PYTHON", "ON").upper() in ("OFF", "0", "FALSE", "NO"):
                raise RuntimeError("FTRUN_CMAKE_BUILD_DIR=%s: configured with FTRUN_BUILD_PYTHON=OFF; "
                                   "expected ON (the extension is what pip installs)" % given)
            return build_dir
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        args = ["-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DFTRUN_BUILD_PYTHON=ON",
                "-DPython3_EXECUTABLE=" + sys.executable]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            args += ["-G", "Ninja"]
        self.run_cmake(*args, *shlex.split(os.environ.get("CMAKE_ARGS", "")))
        return build_dir

    def build_extension(self, ext):
        build_dir = self.cmake_tree()
        self.run_cmake("--build", build_dir, "--target", "_ftrun")
        stage = os.path.abspath(os.path.join(self.build_temp, "stage"))
        shutil.rmtree(stage, ignore_errors=True)
        for component in ("python", "library"):
            self.run_cmake("--install", build_dir, "--prefix", stage, "--component", component)
        pydir = cache_values(build_dir).get("FTRUN_INSTALL_PYTHONDIR", "")
        built = glob.glob(os.path.join(stage, pydir, "ftrun", "_ftrun*.so"))
        if len(built) != 1:
            raise RuntimeError("cmake --install --component python: expected one _ftrun*.so in %s/%s/ftrun, "
                               "found %s" % (stage, pydir, built or "none"))
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        if not built[0].endswith(suffix):
            raise RuntimeError("%s: built for another Python than %s (expected the suffix %s); reconfigure "
                               "with -DPython3_EXECUTABLE=%s" % (built[0], sys.executable, suffix, sys.executable))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(built[0], dest)
        # libftrun by its SONAME (the link the library component installs), beside the extension.
        sonames = [p for p in glob.glob(os.path.join(stage, "lib*", "libftrun.so.*")) if os.path.islink(p)]
        if len(sonames) != 1:
            raise RuntimeError("cmake --install --component library: expected one libftrun.so.<soname> link in "
                               "%s/lib*, found %s" % (stage, sonames or "none"))
        shutil.copy2(sonames[0], os.path.join(os.path.dirname(dest), os.path.basename(sonames[0])))


os.makedirs(os.path.join(ROOT, PIP_BUILD), exist_ok=True)
setup(
    version=project_version(),
    ext_modules=[Extension("ftrun._ftrun", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": PIP_BUILD}, "egg_info": {"egg_base": PIP_BUILD}},
)
