"""pip install --no-build-isolation .  — the `attn` package (attn.torch included) built by the
project's own CMake, with the system's setuptools (Debian's python3-setuptools; nothing is
downloaded).

The extension attn._attn is the CMake target attn_python, built in a CMake tree of its own
(under setuptools' build_temp) or, when ATTN_CMAKE_BUILD_DIR names one, in that configured
tree (the test installs from the tree it was built in). The pure-Python files come from
python/attn. CMAKE_ARGS adds configure options; CMAKE_BUILD_PARALLEL_LEVEL the jobs; ATTN_SETUP_WORK moves
setuptools' build/ and attn.egg-info/ out of the source tree (pip builds in tree).
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(attn VERSION ([0-9.]+)", f.read()).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        tree = os.environ.get("ATTN_CMAKE_BUILD_DIR") or os.path.join(os.path.abspath(self.build_temp), "cmake")
        if not os.path.exists(os.path.join(tree, "CMakeCache.txt")):
            cmd = ["cmake", "-S", ROOT, "-B", tree, "-DCMAKE_BUILD_TYPE=Release", f"-DATTN_PYTHON={sys.executable}",
                   "-DATTN_BUILD_TOOLS=OFF", "-DATTN_BUILD_TESTS=OFF", "-DATTN_BUILD_EXAMPLES=OFF",
                   "-DATTN_BUILD_DEV=OFF"]
            if shutil.which("ninja"):
                cmd += ["-G", "Ninja"]
            if shutil.which("ccache"):
                cmd += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
            subprocess.check_call(cmd + shlex.split(os.environ.get("CMAKE_ARGS", "")))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", tree, "--target", "attn_python", "-j", jobs])
        built = [f for f in os.listdir(os.path.join(tree, "python", "attn")) if f.startswith("_attn.")]
        if len(built) != 1:
            raise RuntimeError(f"attn: expected one _attn extension in {tree}/python/attn but found {built}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(tree, "python", "attn", built[0]), target)


WORK = os.environ.get("ATTN_SETUP_WORK")
if WORK:
    os.makedirs(WORK, exist_ok=True)

setup(
    name="attn",
    version=version(),
    description="Scaled dot-product attention for CPUs: NumPy and PyTorch (attn.torch)",
    packages=["attn", "attn.torch"],
    package_dir={"attn": "python/attn"},
    ext_modules=[Extension("attn._attn", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.8",
    install_requires=["numpy"],
    zip_safe=False,
    options={"build": {"build_base": os.path.join(WORK, "build")}, "egg_info": {"egg_base": WORK}} if WORK else {},
)
