# The README's commands. `make demo` runs the main job on the bundled model; `make test` builds and
# runs every test. Both install missing Debian packages (as root) and the pinned oracle venv first.
BUILD ?= build
VENV ?= $(BUILD)/venv
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
ifneq ($(CI),)
CMAKE_FLAGS += -DDSPEC_WERROR=ON
endif

.PHONY: all deps venv build test demo test-asan test-cuda clean

all: build

deps:
	@scripts/install-deps.sh

venv: deps
	@scripts/setup-venv.sh $(VENV)

build: deps venv
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DDSPEC_PYTHON=$(abspath $(VENV))/bin/python $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The whole suite, then the C tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE cuda
	@$(MAKE) --no-print-directory test-asan

demo: build
	@scripts/demo.sh $(BUILD)/dspec

# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer (C tests only).
test-asan: deps
	@echo "== C tests under AddressSanitizer + UndefinedBehaviorSanitizer"
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSPEC_SANITIZE=address,undefined -DDSPEC_CUDA=OFF $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	@cd $(BUILD)-asan && ctest --output-on-failure -j $(JOBS) -L cpu

# CUDA tests (device machine only).
test-cuda: build
	@cd $(BUILD) && ctest --output-on-failure -L cuda

clean:
	rm -rf $(BUILD) $(BUILD)-asan
