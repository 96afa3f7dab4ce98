"""Packaging (issue 29): one version string, the license metadata, the typing marker and stub
installed with the package, and `import fna` without importing torch."""

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap

import pytest

import fna
from fna import _C


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _installed():
    """The installed distribution `fna` was imported from, or None when it runs from a source
    tree (PYTHONPATH=python, as the GPU script does) with no metadata of its own."""
    try:
        dist = importlib.metadata.distribution("fna")
    except importlib.metadata.PackageNotFoundError:
        return None
    here = os.path.realpath(fna.__file__)
    for f in dist.files or ():
        if str(f).endswith("fna/__init__.py") and os.path.realpath(str(f.locate())) == here:
            return dist
    return None


def _cmake_version():
    with open(os.path.join(_ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(fna\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", f.read()).group(1)


def test_one_version():
    """CMakeLists.txt's project(fna VERSION ...) is the only place the version is written: the
    package metadata (pyproject reads it) of an installed copy, or CMakeLists.txt itself when fna
    runs from the source tree, fna.__version__ and the C++ fna::version() agree."""
    dist = _installed()
    written = dist.version if dist is not None else _cmake_version()
    assert written == fna.__version__ == fna.version() == _C.version()
    parts = fna.__version__.split(".")
    assert len(parts) == 3 and all(p.isdigit() for p in parts), fna.__version__


def test_license_metadata():
    dist = _installed()
    if dist is None:  # from the source tree: what the metadata will be built from
        with open(os.path.join(_ROOT, "pyproject.toml")) as f:
            assert re.search(r'^license = "MIT"$', f.read(), re.M)
        with open(os.path.join(_ROOT, "LICENSE")) as f:
            assert "MIT License" in f.read()
        return
    assert dist.metadata["License-Expression"] == "MIT"
    files = [str(f) for f in dist.files or ()]
    assert any(f.endswith("licenses/LICENSE") for f in files), files


def _package_file(name):
    return os.path.join(os.path.dirname(fna.__file__), name)


def test_typing_files_installed():
    """py.typed and the extension's stub travel with the package."""
    assert os.path.isfile(_package_file("py.typed"))
    assert os.path.isfile(_package_file("_C.pyi"))


def test_stub_matches_extension():
    """_C.pyi names exactly what fna._C defines (regenerate it with nanobind.stubgen otherwise)."""
    with open(_package_file("_C.pyi")) as f:
        tree = ast.parse(f.read())
    stubbed = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            stubbed.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stubbed.add(node.target.id)
    defined = {n for n in dir(_C) if not n.startswith("_")}
    assert stubbed == defined, (sorted(defined - stubbed), sorted(stubbed - defined))


def _run(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout + res.stderr


def test_import_does_not_import_torch():
    """`import fna` and the NumPy path leave torch unimported (it takes seconds)."""
    _run("""
        import sys
        import numpy as np
        import fna
        assert "torch" not in sys.modules, "import fna imported torch"
        q = np.random.default_rng(0).standard_normal((1, 6, 2, 4)).astype(np.float32)
        fna.na1d(q, q, q, 3)
        fna.na_backward(q, q, q, q, q, np.zeros((1, 6, 2), np.float32), 3)
        fna.resolve_backend(None, "cpu")
        fna.fused_configs(2, "bfloat16", 64)
        assert "torch" not in sys.modules, "the NumPy path imported torch"
        print("ok")
    """)


def test_torch_after_lazy_import():
    """torch imported after fna: fna's torch side (the custom ops) loads right after torch's
    import, so a first call inside torch.compile(fullgraph=True) traces (torch 2.4 included), and
    eager calls and autograd work."""
    pytest.importorskip("torch")
    _run("""
        import sys
        import fna
        assert fna._compat.torch is None and "torch" not in sys.modules  # fna never imports it
        import torch
        assert fna._compat.torch is torch  # its torch side loads right after torch's import
        q = torch.randn(1, 6, 6, 2, 8)
        ref = torch.from_numpy(fna.na2d(q.numpy(), q.numpy(), q.numpy(), 3))
        f = torch.compile(lambda a: fna.na2d(a, a, a, 3) * 2, backend="eager", fullgraph=True)
        torch.testing.assert_close(f(q), ref * 2)
        q.requires_grad_(True)
        out = fna.na2d(q, q, q, 3)
        torch.testing.assert_close(out.detach(), ref)
        out.sum().backward()
        assert q.grad.shape == q.shape
        assert fna.resolve_backend(None, torch.device("cpu")) == "cpu"
        assert fna.NeighborhoodAttention2D(16, 2, 3)(torch.randn(1, 6, 6, 16)).shape == (1, 6, 6, 16)
        print("ok")
    """)
    _run("""
        import torch
        import fna
        assert fna._compat.torch is torch  # torch imported first: the ops register at import fna
        q = torch.randn(1, 6, 2, 8)
        torch.testing.assert_close(fna.na1d(q, q, q, 3),
                                   torch.from_numpy(fna.na1d(q.numpy(), q.numpy(), q.numpy(), 3)))
        print("ok")
    """)


def test_installed_copy_when_asked():
    """`make wheel-test` sets FNA_TEST_INSTALLED=1: the tests must then run against the wheel's
    installed copy, never the source tree."""
    if os.environ.get("FNA_TEST_INSTALLED") != "1":
        pytest.skip("not a wheel test run (FNA_TEST_INSTALLED unset)")
    dist = _installed()
    assert dist is not None, f"fna was imported from {fna.__file__}, not an installed distribution"
    assert not os.path.realpath(fna.__file__).startswith(os.path.join(_ROOT, "python") + os.sep)
    # The wheel's copy in the test environment itself, not one its .pth file makes visible (the
    # build venv's, make wheel-test).
    assert os.path.realpath(fna.__file__).startswith(os.path.realpath(sys.prefix) + os.sep), \
        (fna.__file__, sys.prefix)


def test_bench_through_extension():
    """The installed `fna-bench` command runs the C++ CLI through the extension (fna._bench):
    a real run on a small CPU problem, its exit code and its table."""
    res = subprocess.run(
        [sys.executable, "-m", "fna._bench", "--device", "cpu", "--shape", "10x9", "--kernel", "3",
         "--repeats", "1", "--backend", "cpu", "--dim", "8"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "shape=10x9" in res.stdout and "\ncpu " in res.stdout, res.stdout
    bad = subprocess.run([sys.executable, "-m", "fna._bench", "--shape", "0x9"], capture_output=True,
                         text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    assert bad.returncode == 2 and "fna-bench:" in bad.stderr, bad.stdout + bad.stderr
    dist = _installed()
    if dist is not None:  # the installed command is this entry point
        eps = [ep for ep in dist.entry_points if ep.group == "console_scripts"]
        assert [(ep.name, ep.value) for ep in eps] == [("fna-bench", "fna._bench:main")], eps
