"""Packaging (issue 29): one version string, the typing marker and stub installed with the package."""

import ast
import importlib.metadata
import os

import fna
from fna import _C


def test_one_version():
    """CMakeLists.txt's project(fna VERSION ...) is the only place the version is written: the
    package metadata (pyproject reads it), fna.__version__ and the C++ fna::version() agree."""
    assert importlib.metadata.version("fna") == fna.__version__ == fna.version() == _C.version()
    parts = fna.__version__.split(".")
    assert len(parts) == 3 and all(p.isdigit() for p in parts), fna.__version__


def test_license_metadata():
    meta = importlib.metadata.metadata("fna")
    assert meta["License-Expression"] == "MIT"
    files = [str(f) for f in importlib.metadata.distribution("fna").files or ()]
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
