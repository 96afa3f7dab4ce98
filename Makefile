# fna — two commands do all set-up on a fresh machine:
#   make test    install what is missing, build, run every C++ and Python test
#   make bench   install what is missing, build, run fna-bench on its default problem
PY        ?= python3
BUILD     ?= build/py
JOBS      ?= $(shell nproc)
STAMP     := build/.deps-stamp

.PHONY: all deps build test test-cpp test-python bench clean

all: build

# System packages (GoogleTest, CMake) from Debian, Python packages pinned in requirements-dev.txt.
$(STAMP): requirements-dev.txt
	@bash tools/install_deps.sh "$(PY)"
	@mkdir -p build && touch $(STAMP)

deps: $(STAMP)

# One CMake build (scikit-build-core, build dir $(BUILD)) makes the library, the C++ tests,
# fna-bench and the Python extension, then installs the package.
build: deps
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip install --no-build-isolation --no-deps -q . \
	  -Cbuild-dir=$(BUILD)

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-python: build
	cd tests/python && $(PY) -m pytest -q -x --durations=10 .

test: test-cpp test-python

bench: build
	$(BUILD)/fna-bench

clean:
	rm -rf build python/fna/_C*.so
