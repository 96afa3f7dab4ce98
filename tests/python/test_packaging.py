"""Packaging (issue 29): one version string, the license metadata."""

import importlib.metadata

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
