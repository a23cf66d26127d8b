"""`pip install .` ships kernels/ inside the wheel and the installed package finds it."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _local_build_backend():
    """True when this environment's own setuptools can build the wheel (pyproject's
    build-system: setuptools >= 68; 70.1 and later need no separate wheel package), so that the
    build needs no package index (a lent GPU machine has none)."""
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(p) for p in setuptools.__version__.split(".")[:2])
    if (major, minor) >= (70, 1):
        return True
    try:
        import wheel  # noqa: F401
    except ImportError:
        return False
    return major >= 68


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # From a copy of what the wheel is made of: setuptools builds in the source tree's build/,
    # and test processes that each build (pytest-xdist gives each its own module fixture)
    # would collide there.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("dlprim_py", "kernels"):
        shutil.copytree(ROOT / name, source / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    isolation = ["--no-build-isolation"] if _local_build_backend() else []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation,
                    "-q", "-w", str(out), str(source)], check=True, cwd=out)
    (path,) = out.glob("dlprim_py-*.whl")
    return path


def test_wheel_holds_every_kernel_template(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).name for n in names if n.startswith("dlprim_py/kernels/")}
    in_tree = {p.name for p in (ROOT / "kernels").glob("*.cl.mako")}
    assert in_tree and in_tree <= shipped


def test_installed_package_builds_a_kernel_outside_the_source_tree(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True)
    code = (
        "import numpy as np, dlprim_py as dp\n"
        "from dlprim_py.program import kernels_dir\n"
        "print(kernels_dir())\n"
        "ctx = dp.Context()\n"
        "x = dp.Tensor.from_numpy(ctx, np.arange(5, dtype=np.float32))\n"
        "print((x * 2.0).numpy().tolist())\n"
    )
    # The installed copy first; other PYTHONPATH entries (where pyopencl may live) stay, except
    # any that holds a dlprim_py source tree.
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and not (Path(p) / "dlprim_py").exists()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target)] + kept), DLPRIM_NO_CACHE="1")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, check=True)
    kernels, values = result.stdout.strip().splitlines()
    assert Path(kernels).is_relative_to(target)
    assert values == "[0.0, 2.0, 4.0, 6.0, 8.0]"
