import atexit
import os
import shutil
import sys
import tempfile

# `helpers` lives next to the tests; make it importable however pytest is invoked.
sys.path.insert(0, os.path.dirname(__file__))

# torch.compile's on-disk caches key a compiled backward by the traced forward graph, not by the
# backward op's signature: code cached by a run of another fna version (another na_backward
# schema) would be reused and fail. Each test session compiles into its own cache directory,
# removed at exit, unless one is chosen explicitly. (Set before torch is imported, which reads it.)
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="fna-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
