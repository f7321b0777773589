# streamfeed — build, test, run.
#
#   make              build/streamfeed, on every core (the CUDA backend where nvcc is found and
#                     a GPU is usable, or for the tests; CUDA=0|1 decides, and is remembered
#                     for later makes in the same build folder)
#   make test         unit tests (cmocka), integration tests (pytest), fuzz smoke run
#   make demo         the main job: server + streamfeed-load training on the learnable task
#   make run          start the server on 127.0.0.1 (the tiny model when there is no GPU)
#   make gpu-test     CUDA ops against the reference (needs a GPU; skips visibly without)
#   make gpu-sanitize the GPU tests under compute-sanitizer (memcheck, racecheck, synccheck, initcheck)
#   make bench        side-by-side benchmarks (needs a GPU)
#   make bench-jpeg   JPEG decode and JPEG-fed training against PyTorch (needs a GPU)
#   make bench-multi-gpu  data-parallel training on 1 and G GPUs against PyTorch DDP
#   make fuzz         every parser under libFuzzer (clang), FUZZ_SECONDS each (300)
#   make fuzz-long    the same, an hour each (FUZZ_SECONDS=3600): tests/fuzz/RESULTS.md
#   make soak         32 connections of mixed traffic for SOAK_SECONDS (600), checked
#   make deps         install the Debian packages (root), or print the command
#
# Options: CUDA=0|1  CUDA_ARCH=sm_90  DEPS_PREFIX=/opt/deps/usr  SANITIZE=address|undefined
#          DEBUG=1   PORT=8080  HOST=127.0.0.1

SHELL := /bin/bash
.DEFAULT_GOAL := all

# Every build runs on all cores unless -j is given: a first `make demo` should
# not spend minutes on one core of a many-core machine. Only the outermost
# make sets it; a make it starts shares its jobs (its MAKEFLAGS does not show
# them while it reads this file, so it must not set its own).
NPROC ?= $(shell nproc 2>/dev/null || echo 2)
ifeq ($(MAKELEVEL)$(filter -j% j%,$(MAKEFLAGS)),0)
  MAKEFLAGS += -j$(NPROC)
endif
# The flags a make that must run its goals one after another passes on: the
# parent's jobserver left out, so that its -j1 neither warns nor is overridden.
SERIAL_MAKEFLAGS = $(filter-out -j% --jobserver%,$(MAKEFLAGS))

BUILD   ?= build
CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# CUDA=0|1 given on the command line (or in the environment) is remembered in
# $(BUILD)/.cuda-choice, so a later plain `make run` or `make test` keeps the
# flavour built instead of rebuilding everything for the other one.
CUDA_CHOICE_FILE = $(BUILD)/.cuda-choice
# Without a choice, the CUDA backend is built where nvcc is found and either a
# GPU is usable or the goal is one that must compile the CUDA code (the tests,
# the benchmarks), so that CUDA code cannot rot in CI. `make demo` or `make run`
# on a host with nvcc but no usable GPU builds the CPU backend alone, in
# seconds rather than minutes, since that is the backend it would run on; a
# build folder that already holds the CUDA flavour keeps it, so `make test`
# then `make demo` do not rebuild everything twice.
CUDA_GOALS := test test-builds test-builds-main gpu-test bench bench-bins bench-jpeg bench-multi-gpu
GPU_USABLE ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(origin CUDA),undefined)
  CUDA := $(strip $(shell cat $(CUDA_CHOICE_FILE) 2>/dev/null))
  ifeq ($(CUDA),)
    ifeq ($(NVCC),)
      CUDA := 0
      CUDA_WHY := no nvcc at build time
    else ifneq ($(GPU_USABLE)$(filter $(CUDA_GOALS),$(MAKECMDGOALS))$(wildcard $(BUILD)/.flavour-cuda1*),)
      CUDA := 1
    else
      CUDA := 0
      CUDA_WHY := no usable GPU on the build host; CUDA=1 builds the CUDA backend
    endif
  else
    CUDA_WHY := CUDA=$(CUDA), remembered in $(CUDA_CHOICE_FILE)
  endif
else
  $(shell mkdir -p $(BUILD) && echo $(CUDA) > $(CUDA_CHOICE_FILE))
  CUDA_WHY := CUDA=$(CUDA)
endif
CUDA_ARCH ?= sm_90
PORT    ?= 8080
PYTHON  ?= python3
VENV    := .venv

# python3-venv: Debian's python3 makes no virtualenv without it (the tests' and the package check's).
# libspng-dev, libwebp-dev: the PNG and WebP decoders (docs/DEPENDENCIES.md says why each).
DEB_PKGS := libmicrohttpd-dev libgnutls28-dev libcjson-dev libcurl4-openssl-dev libgloo-dev libturbojpeg0-dev libjpeg62-turbo-dev libspng-dev libwebp-dev libcmocka-dev prometheus clang libclang-rt-14-dev pkg-config openssl python3-venv

CPPFLAGS += -I. -D_GNU_SOURCE
CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -pthread -MMD -MP
LDLIBS   += -lmicrohttpd -lgnutls -lcjson -lcurl -lturbojpeg -ljpeg -lspng -lwebp -lgloo -lstdc++ -lm -lpthread

ifdef DEBUG
  CFLAGS += -O0
endif
ifdef SANITIZE
  CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
  LDFLAGS += -fsanitize=$(SANITIZE)
endif
ifdef DEPS_PREFIX
  CPPFLAGS += -I$(DEPS_PREFIX)/include
  # Debian puts Gloo in lib/, the others in lib/x86_64-linux-gnu/.
  LDFLAGS  += -L$(DEPS_PREFIX)/lib/x86_64-linux-gnu -Wl,-rpath,$(DEPS_PREFIX)/lib/x86_64-linux-gnu \
              -L$(DEPS_PREFIX)/lib -Wl,-rpath,$(DEPS_PREFIX)/lib
  NVCC_LDFLAGS += -I$(DEPS_PREFIX)/include -L$(DEPS_PREFIX)/lib/x86_64-linux-gnu -Xlinker -rpath,$(DEPS_PREFIX)/lib/x86_64-linux-gnu \
                  -L$(DEPS_PREFIX)/lib -Xlinker -rpath,$(DEPS_PREFIX)/lib
endif

# ---- sources ---------------------------------------------------------------
SERVER_SRC  := $(filter-out server/main.c,$(wildcard server/*.c))
# The encoded-file header readers, which the body parser calls.
IMAGE_HEADER_SRC := server/image_header.c server/jpeg_header.c server/png_header.c server/webp_header.c
HANDLER_SRC := $(wildcard handlers/*.c)
GPU_SRC     := $(wildcard gpu/*.c) $(wildcard gpu/ref/*.c)
# collective/: collectives between the ranks of a data-parallel job (Gloo, C++ behind a C API).
COLLECTIVE_SRC    := $(wildcard collective/*.c)
COLLECTIVE_CC_SRC := $(wildcard collective/*.cc)
CXX         ?= g++
CXXFLAGS    ?= -O2 -g
CXXFLAGS    += -std=c++17 -Wall -Wextra -Werror -Wno-unused-parameter -pthread -MMD -MP
ifeq ($(CUDA),1)
  CUDA_C_SRC  := $(wildcard gpu/cuda/*.c)
  CUDA_CU_SRC := $(wildcard gpu/cuda/*.cu)
  CPPFLAGS    += -DSF_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  NVCCFLAGS   ?= -O3 -lineinfo
  # Warnings are errors, as for the C code: nvcc's own (-Werror all-warnings)
  # and the host compiler's (-Xcompiler -Werror).
  NVCCFLAGS   += -std=c++17 -arch=$(CUDA_ARCH) -I. -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-Werror -Werror all-warnings
  CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib))
  LDFLAGS     += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR)
  LDLIBS      += -lcudnn -lcublasLt -lcublas -lcudart -l:libnvjpeg.so.13 -lstdc++ -ldl -lrt
  BACKEND_NAME := cuda
  # nvJPEG ships with the CUDA toolkit of a GPU host. A build machine whose
  # toolkit lacks it (a compiler-only install, CI) takes the header and library
  # from PyPI's nvidia-nvjpeg wheel of the same CUDA release, unpacked into
  # the build folder: the GPU host, which cannot reach PyPI, never needs it.
  ifeq ($(wildcard $(CUDA_HOME)/include/nvjpeg.h),)
    CUDA_RELEASE := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
    NVJPEG_WHEEL := $(BUILD)/nvjpeg-wheel
    NVJPEG_HOME  := $(NVJPEG_WHEEL)/nvidia/cu$(firstword $(subst ., ,$(CUDA_RELEASE)))
    NVJPEG_DEP   := $(NVJPEG_HOME)/include/nvjpeg.h
    CPPFLAGS     += -I$(NVJPEG_HOME)/include
    NVCCFLAGS    += -I$(NVJPEG_HOME)/include
    LDFLAGS      += -L$(NVJPEG_HOME)/lib -Wl,-rpath,$(abspath $(NVJPEG_HOME)/lib)
    NVCC_LDFLAGS += -L$(NVJPEG_HOME)/lib -Xlinker -rpath,$(abspath $(NVJPEG_HOME)/lib)
  endif
else
  CUDA_C_SRC  :=
  CUDA_CU_SRC :=
  GPU_SRC     += gpu/nocuda/backend_nocuda.c
  BACKEND_NAME := ref
endif

LIB_C_SRC := $(SERVER_SRC) $(HANDLER_SRC) $(GPU_SRC) $(CUDA_C_SRC) $(COLLECTIVE_SRC)
LIB_OBJ   := $(LIB_C_SRC:%.c=$(BUILD)/%.o) $(COLLECTIVE_CC_SRC:%.cc=$(BUILD)/%.cc.o) $(CUDA_CU_SRC:%.cu=$(BUILD)/%.cu.o) $(BUILD)/openapi_spec.o
LIB       := $(BUILD)/libstreamfeed.a

UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
GPU_TEST_SRC := $(wildcard tests/gpu/test_*.c) $(wildcard tests/gpu/test_*.cu)
GPU_TEST_BIN := $(patsubst tests/gpu/%.cu,$(BUILD)/tests/gpu/%,$(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(GPU_TEST_SRC)))

VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
COMMIT  := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
CPPFLAGS += -DSF_BACKEND_BUILT=\"$(BACKEND_NAME)\"
# Only these objects carry the version, so a new commit does not rebuild
# everything; and they depend on stamp files rewritten only when their text
# changes, so a make with nothing new (make run, make demo) relinks nothing.
$(BUILD)/server/app.o $(BUILD)/server/main.o $(BUILD)/client/options.o: CPPFLAGS += -DSF_VERSION=\"$(VERSION)\" -DSF_COMMIT=\"$(COMMIT)\"
$(BUILD)/server/app.o $(BUILD)/server/main.o $(BUILD)/client/options.o: $(BUILD)/version.stamp
# Why a CPU-only build has no CUDA backend: CUDA=0 asked for, or no nvcc found.
$(BUILD)/gpu/nocuda/backend_nocuda.o: CPPFLAGS += -DSF_NOCUDA_REASON='"$(CUDA_WHY)"'
$(BUILD)/gpu/nocuda/backend_nocuda.o: $(BUILD)/nocuda.stamp
$(BUILD)/version.stamp: .FORCE
	@mkdir -p $(@D); echo '$(VERSION) $(COMMIT)' | cmp -s - $@ || echo '$(VERSION) $(COMMIT)' > $@
$(BUILD)/nocuda.stamp: .FORCE
	@mkdir -p $(@D); echo '$(CUDA_WHY)' | cmp -s - $@ || echo '$(CUDA_WHY)' > $@
.FORCE:

.PHONY: gpu-sanitize package-test test-builds test-builds-main test-builds-side sanitize-bins sanitize-unit sanitize-integration bench-jpeg bench-ingest bench-multi-gpu client-test client-typecheck client-suite bench-bins ops-test deploy-render docker-image sanitize-test docs all test unit integration fuzz fuzz-long fuzz-smoke soak demo run gpu-test bench clean deps venv check-tools print-found
all: print-found $(BUILD)/streamfeed $(BUILD)/streamfeed-load $(UNIT_BIN)

print-found:
	@printf '%s\n' "streamfeed build: $(if $(filter 1,$(CUDA)),✓ nvcc ($(NVCC)) → CUDA backend ($(CUDA_ARCH)),✗ CUDA ($(CUDA_WHY)) → CPU reference backend only)"
	@$(if $(filter 1,$(CUDA)),printf '%s\n' "  $(if $(NVJPEG_DEP),✗ nvjpeg.h in the toolkit → nvJPEG from the nvidia-nvjpeg wheel ($(NVJPEG_HOME)),✓ nvJPEG from the toolkit)",true)
	@printf '%s\n' "  $(if $(wildcard /dev/nvidia0),✓ GPU device node,✗ GPU device node: GPU tests will skip)"

# Objects depend on a stamp naming the build flavour, so switching CUDA=0/1 or
# SANITIZE in one build folder rebuilds everything instead of mixing objects.
FLAVOUR_STAMP := $(BUILD)/.flavour-cuda$(CUDA)$(if $(SANITIZE),-$(SANITIZE))
$(FLAVOUR_STAMP):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/.flavour-*
	@touch $@

$(BUILD)/%.o: %.c $(FLAVOUR_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cc.o: %.cc $(FLAVOUR_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) $(if $(SANITIZE),-fsanitize=$(SANITIZE) -fno-omit-frame-pointer) -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(FLAVOUR_STAMP) | $(NVJPEG_DEP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -DSF_HAVE_CUDA=1 -MMD -MP -c $< -o $@

ifdef NVJPEG_DEP
$(NVJPEG_DEP):
	@echo "nvjpeg.h is not in $(CUDA_HOME)/include: fetching nvidia-nvjpeg==$(CUDA_RELEASE).* from PyPI"
	@rm -rf $(NVJPEG_WHEEL) && mkdir -p $(NVJPEG_WHEEL)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d $(NVJPEG_WHEEL) "nvidia-nvjpeg==$(CUDA_RELEASE).*"
	$(PYTHON) -m zipfile -e $(NVJPEG_WHEEL)/nvidia_nvjpeg-*.whl $(NVJPEG_WHEEL)
	@test -f $@ || { echo "the nvidia-nvjpeg wheel has no $@"; exit 1; }
endif

# The spec is linked into the binary (GET /openapi.yaml serves it).
$(BUILD)/openapi_spec.o: openapi/streamfeed.yaml
	@mkdir -p $(dir $@)
	ld -r -b binary -z noexecstack -o $@ $<

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/streamfeed: $(BUILD)/server/main.o $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# The load generator is a CPU-side HTTP client: it links the modules it shares
# with the server (the safetensors header writer, which checks JPEG headers and
# UTF-8) and the libraries it calls (libjpeg-turbo encodes its generated JPEG
# workloads), so it runs on a machine without the CUDA libraries (no
# cuDNN/cuBLAS/cudart needed).
LOAD_OBJ    := $(patsubst %.c,$(BUILD)/%.o,$(wildcard client/*.c)) \
               $(BUILD)/server/safetensors.o $(IMAGE_HEADER_SRC:%.c=$(BUILD)/%.o) $(BUILD)/server/text.o
LOAD_LDLIBS := -lcjson -lcurl -lturbojpeg -lm -lpthread
$(BUILD)/streamfeed-load: $(LOAD_OBJ)
	$(CC) $(LDFLAGS) $^ -o $@ $(LOAD_LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lcmocka

$(BUILD)/tests/gpu/%: tests/gpu/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/gpu/%: tests/gpu/%.cu tests/gpu/gpu_test.h tests/gpu/op_test.h tests/gpu/backend_harness.h gpu/cuda/program.h $(LIB)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVCC_LDFLAGS) -DSF_HAVE_CUDA=1 $(filter-out %.h,$^) -o $@ -Xlinker -rpath,$(CUDA_LIBDIR) $(filter-out -lstdc++ -pthread,$(LDLIBS)) -lpthread

# The BatchNorm tests' inputs, which test_batchnorm_sync shares with the
# op family's compare functions (whose object finds it through -MMD).
$(BUILD)/tests/gpu/test_batchnorm_sync: tests/gpu/bn_inputs.h

# The op case driver links the case table (tests/gpu/op_cases.cu) and the op
# families' compare functions (tests/gpu/ops/), each compiled once (their
# header dependencies come from -MMD), so that a change to one family
# recompiles that family alone.
OP_CASE_OBJ := $(patsubst %.cu,$(BUILD)/%.cu.o,tests/gpu/op_cases.cu $(wildcard tests/gpu/ops/*.cu))
$(BUILD)/tests/gpu/test_ops: tests/gpu/test_ops.cu $(OP_CASE_OBJ) tests/gpu/gpu_test.h tests/gpu/op_test.h tests/gpu/op_cases.h gpu/cuda/program.h $(LIB)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVCC_LDFLAGS) -DSF_HAVE_CUDA=1 $(filter-out %.h,$^) -o $@ -Xlinker -rpath,$(CUDA_LIBDIR) $(filter-out -lstdc++ -pthread,$(LDLIBS)) -lpthread

# ---- tests -----------------------------------------------------------------
# make test runs in two phases, so that the CPU time its suites leave idle
# is not wasted. The main build folder's binaries (the server, the unit
# tests and, where nvcc is found, the GPU test binaries: minutes of nvcc)
# compile in the background at a low priority (nice 10) on a jobserver of their
# own, while the builds and suites that need none of them run in front: the
# sanitizer build and run, the ops and fuzz-smoke suites wait on servers
# and fuzzers for much of their time, and the compiler takes the cores they
# leave idle without slowing them. Then the suites that need the main build
# run. Suites in front run one after another, so that their timings and
# output stay apart.
# The test virtualenv is made in the background too, at normal priority: pip
# spends most of its minutes downloading (torch alone is gigabytes where
# only PyPI answers), so it holds no job slot that the sanitizer build and
# the fuzz targets could use, and the sanitizer's unit tests, which need no
# virtualenv, run meanwhile. The suites that need it start when it is there.
# Then the client package test and the client's type check (BESIDE_SUITES),
# which need the virtualenv alone, run in the background beside the
# sanitizer's suite, at the lowest priority (nice 19): the package test
# spends most of its minute installing from PyPI, and both would otherwise
# hold a core each on their own at the end (mypy is one process), so they
# take what CPU the suites in front, the fuzzers (nice 10) and the main
# build leave.
# Each background job's output is printed when it ends, and its failure fails
# make test as soon as the suite then running has ended. Each runs in a
# session of its own (setsid), so that a failing suite, Ctrl-C or SIGTERM
# stops it with every process it started (nvcc leaves its children running
# when it alone is killed).
# Both builds compile into the main build folder (the fuzz targets' objects
# are there), so this make makes its flavour stamp before they start: the
# makes it starts there, whose goals do not name the CUDA code, take the
# flavour from that stamp, and two makes making it at once could leave it
# newer than objects one of them compiled, which a later make would compile
# again.
MAIN_BUILD_LOG := $(BUILD)/main-build.log
VENV_LOG := $(BUILD)/venv.log
BESIDE_LOG := $(BUILD)/beside-suites.log
BESIDE_SUITES := package-test client-typecheck
FRONT_SUITES := sanitize-integration ops-test fuzz-smoke
MAIN_SUITES := unit integration client-suite gpu-test
test: $(FLAVOUR_STAMP)
	@echo "make test: builds everything (CUDA code too where nvcc is found) and makes the test virtualenv;"
	@echo "  runs the sanitizer, ops and fuzz-smoke suites (the client package test and type check beside them)"
	@echo "  while the main build (the CUDA code) compiles in the background, then the unit, integration,"
	@echo "  client and GPU suites, each in turn;"
	@echo "  about 17 minutes on two idle cores the first time (compiling the CUDA code and the sanitizer run take the most)."
	@set -e; \
	MAKEFLAGS="$(SERIAL_MAKEFLAGS)" setsid nice -n 10 $(MAKE) --no-print-directory -j$(NPROC) test-builds-main \
	  >$(MAIN_BUILD_LOG) 2>&1 & main=$$!; \
	main_running=1; \
	MAKEFLAGS="$(SERIAL_MAKEFLAGS)" setsid $(MAKE) --no-print-directory -j1 $(VENV)/.stamp >$(VENV_LOG) 2>&1 & venv=$$!; \
	venv_running=1; \
	beside_running=0; \
	stop_background() { \
	  [ $$main_running = 0 ] || kill -TERM -- -$$main 2>/dev/null || true; \
	  [ $$beside_running = 0 ] || kill -TERM -- -$$beside 2>/dev/null || true; \
	  [ $$venv_running = 0 ] || kill -TERM -- -$$venv 2>/dev/null || true; \
	}; \
	trap stop_background EXIT; \
	trap 'exit 130' INT; trap 'exit 143' TERM; \
	main_build_ended() { \
	  main_running=0; \
	  if wait $$main; then cat $(MAIN_BUILD_LOG); echo "make test: the main build is done"; \
	  else cat $(MAIN_BUILD_LOG); echo "make test: the main build failed ($(MAIN_BUILD_LOG))"; exit 1; fi; \
	}; \
	venv_ended() { \
	  venv_running=0; \
	  if wait $$venv; then cat $(VENV_LOG); echo "make test: the test virtualenv is ready"; \
	  else cat $(VENV_LOG); echo "make test: making the test virtualenv failed ($(VENV_LOG))"; exit 1; fi; \
	}; \
	$(MAKE) --no-print-directory sanitize-bins $(FUZZ_BINS); \
	MAKEFLAGS="$(SERIAL_MAKEFLAGS)" $(MAKE) --no-print-directory -j1 sanitize-unit; \
	if [ $$venv_running = 1 ] && kill -0 $$venv 2>/dev/null; then echo "make test: waiting for the test virtualenv"; fi; \
	beside_suites_ended() { \
	  beside_running=0; \
	  if wait $$beside; then cat $(BESIDE_LOG); echo "make test: the client package test and the client type check passed"; \
	  else cat $(BESIDE_LOG); echo "make test: the client package test or the client type check failed ($(BESIDE_LOG))"; exit 1; fi; \
	}; \
	venv_ended; \
	MAKEFLAGS="$(SERIAL_MAKEFLAGS)" setsid nice -n 19 $(MAKE) --no-print-directory -j1 $(BESIDE_SUITES) \
	  >$(BESIDE_LOG) 2>&1 & beside=$$!; \
	beside_running=1; \
	for suite in $(FRONT_SUITES); do \
	  if [ $$main_running = 1 ] && ! kill -0 $$main 2>/dev/null; then main_build_ended; fi; \
	  if [ $$beside_running = 1 ] && ! kill -0 $$beside 2>/dev/null; then beside_suites_ended; fi; \
	  MAKEFLAGS="$(SERIAL_MAKEFLAGS)" $(MAKE) --no-print-directory -j1 $$suite; \
	done; \
	if [ $$beside_running = 1 ]; then echo "make test: waiting for the client package test and type check"; beside_suites_ended; fi; \
	if [ $$main_running = 1 ]; then echo "make test: waiting for the main build"; main_build_ended; fi; \
	MAKEFLAGS="$(SERIAL_MAKEFLAGS)" $(MAKE) --no-print-directory -j1 $(MAIN_SUITES)
	@echo "make test: all suites passed"
# What the suites need: the main build folder's binaries, and the rest (the
# sanitizer build, the fuzz targets, the virtualenv), which need none of them.
test-builds: test-builds-main test-builds-side
test-builds-main: all $(if $(filter 1,$(CUDA)),$(GPU_TEST_BIN))
test-builds-side: sanitize-bins $(VENV)/.stamp

unit: $(UNIT_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done

# One virtualenv for every Python test suite (integration, client, contract, ops).
# torch (tests/requirements-torch.txt) is only for the tests that compare with
# PyTorch: tests/install_torch.sh takes it from the PyTorch CPU index, else from
# PyPI when the disk has room for the CUDA build, else leaves it out and those
# tests skip by name.
REQS := $(filter-out tests/requirements-torch.txt,$(wildcard tests/requirements*.txt))
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(VENV)/.stamp: $(REQS) tests/requirements-torch.txt tests/install_torch.sh
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --no-cache-dir --upgrade pip
	$(VENV)/bin/pip install -q --no-cache-dir $(addprefix -r ,$(REQS))
	bash tests/install_torch.sh $(VENV) $(TORCH_INDEX)
	@touch $@
venv: $(VENV)/.stamp

# Two workers, a test file each at a time (--dist loadfile keeps a file's
# module-scoped servers on one worker): most tests wait on a server, so two
# files in flight use the two cores CI has. PYTEST_WORKERS=0 runs them in turn.
# The integration suites hand out their longest files first, and the tests
# of the PyTorch parity files one at a time (tests/integration/conftest.py).
# The sanitizer run uses them too: a test whose deadline is sized to the
# server's work scales it by sfharness.SLOWDOWN under AddressSanitizer.
PYTEST_WORKERS ?= 2
PYTEST_PAR := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)
integration: $(BUILD)/streamfeed $(BUILD)/streamfeed-load $(VENV)/.stamp
	STREAMFEED_BIN=$(abspath $(BUILD)/streamfeed) STREAMFEED_LOAD=$(abspath $(BUILD)/streamfeed-load) \
	  $(VENV)/bin/python -m pytest -q -rs $(PYTEST_PAR) tests/integration

# The Python client: mypy --strict over the package (client-typecheck), then
# its tests against the real binary, the API contract (schemathesis) and a
# real Prometheus scraping the service (client-suite). The package ships
# py.typed, so its typing is checked as strictly as users' mypy will. The
# type check needs no build: make test runs it beside the sanitizer's suite.
client-test: client-typecheck
	@MAKEFLAGS="$(SERIAL_MAKEFLAGS)" $(MAKE) --no-print-directory -j1 client-suite
client-typecheck: $(VENV)/.stamp
	cd client/python && $(abspath $(VENV))/bin/python -m mypy --strict --no-incremental streamfeed
client-suite: $(BUILD)/streamfeed $(VENV)/.stamp
	STREAMFEED_BIN=$(abspath $(BUILD)/streamfeed) $(VENV)/bin/python -m pytest -q -rs -p no:cacheprovider $(PYTEST_PAR) \
	  tests/client tests/contract

# The Python client as a package: wheel and sdist built and checked, installed
# into a fresh virtualenv (packages from PyPI), imported and type-checked there.
package-test: $(VENV)/.stamp
	bash tests/package/check_client_package.sh $(VENV) $(BUILD)/client-package

# Deployment artefacts: OpenAPI spec, Dockerfile (hadolint), kustomize render +
# kubernetes-validate, promtool rule tests, Grafana dashboard.
ops-test: $(VENV)/.stamp
	$(VENV)/bin/python -m pytest -q -rs -p no:cacheprovider tests/ops

deploy-render: $(VENV)/.stamp
	@$(VENV)/bin/kubectl kustomize deploy/overlays/$(or $(OVERLAY),gpu)

# Needs a container engine (none on the CI machines): docker build with the repo as context.
docker-image:
	docker build -f docker/Dockerfile --build-arg CUDA_ARCH=$(CUDA_ARCH) \
	  --build-arg VERSION=$(VERSION) --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
	  -t streamfeed:$(VERSION) .

# The integration suite against a CPU-only build under ASan + LSan + UBSan:
# a sanitizer report, a leak at exit or a UBSan "runtime error" fails the test
# that started the server (tests/integration/sfharness.py reads its stderr and
# exit status). Then the start–requests–stop cycle of tests/sanitize.
# The unit tests run under the same sanitizers first: they hold the reference
# layer kernels the integration run's long numerical comparisons leave out
# under AddressSanitizer (tests/integration/test_export_parity.py says which).
SAN_BUILD := $(BUILD)/asan
SAN_ENV := UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1
sanitize-bins:
	$(MAKE) --no-print-directory CUDA=0 SANITIZE=address,undefined BUILD=$(SAN_BUILD) \
	  $(SAN_BUILD)/streamfeed $(SAN_BUILD)/streamfeed-load $(UNIT_SRC:tests/unit/%.c=$(SAN_BUILD)/tests/%)
sanitize-test: sanitize-bins $(VENV)/.stamp
	@MAKEFLAGS="$(SERIAL_MAKEFLAGS)" $(MAKE) --no-print-directory -j1 sanitize-unit sanitize-integration
sanitize-unit: sanitize-bins
	$(SAN_ENV) $(MAKE) --no-print-directory CUDA=0 SANITIZE=address,undefined BUILD=$(SAN_BUILD) unit
sanitize-integration: sanitize-bins $(VENV)/.stamp
	$(SAN_ENV) \
	  STREAMFEED_BIN=$(abspath $(SAN_BUILD)/streamfeed) STREAMFEED_LOAD=$(abspath $(SAN_BUILD)/streamfeed-load) \
	  $(VENV)/bin/python -m pytest -q -rs -p no:cacheprovider $(PYTEST_PAR) tests/integration
	STREAMFEED_ASAN_BIN=$(abspath $(SAN_BUILD)/streamfeed) $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/sanitize

# Not part of `make test`: N connections of mixed traffic for SOAK_SECONDS
# against the CPU build (SOAK_BIN=build/asan/streamfeed for a sanitized soak).
SOAK_SECONDS ?= 600
SOAK_CONNECTIONS ?= 32
soak: $(BUILD)/streamfeed $(VENV)/.stamp
	STREAMFEED_BIN=$(abspath $(or $(SOAK_BIN),$(BUILD)/streamfeed)) $(VENV)/bin/python tests/soak/soak.py \
	  --seconds $(SOAK_SECONDS) --connections $(SOAK_CONNECTIONS)

# ---- fuzzing: clang libFuzzer with ASan + UBSan --------------------------------
# One target per parser: tests/fuzz/fuzz_<name>.c, built with the sources it
# needs (FUZZ_SRC_<name>) and started from its checked-in seeds
# (FUZZ_CORPUS_<name>); the corpus it grows lives in $(BUILD)/fuzz-corpus/<name>.
# To add one: append <name> to FUZZ_TARGETS and set the two variables.
# The targets share most of their sources (the header readers, the layer
# registry and the reference layers), so each source is compiled once, with
# the fuzzer's instrumentation, into $(BUILD)/fuzz-obj/, and every target
# that needs it links that object.
FUZZ_CC ?= clang
FUZZ_FLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
FUZZ_TARGETS := safetensors config_patch jpeg_header png_header webp_header checkpoint
# The body parser calls the JPEG header reader.
FUZZ_SRC_safetensors := server/safetensors.c $(IMAGE_HEADER_SRC) server/text.c
FUZZ_CORPUS_safetensors := tests/fuzz/corpus
# The layer registry (gpu/layers.c) names each kind's reference hooks: a
# target that resolves models links the reference layer families with it.
FUZZ_REF_LAYERS := $(filter-out gpu/ref/backend_ref.c gpu/ref/jpeg.c gpu/ref/image.c gpu/ref/png.c gpu/ref/webp.c gpu/ref/augment.c gpu/ref/loss.c gpu/ref/optimizer.c,$(wildcard gpu/ref/*.c))
# config_checks.c checks http.tls_priorities with GnuTLS (server/tls.c).
FUZZ_SRC_config_patch := $(wildcard server/config*.c) server/netaddr.c server/lr_schedule.c server/text.c server/tls.c gpu/model.c gpu/layers.c gpu/layer_json.c gpu/layer_init.c gpu/layers_doc.c $(FUZZ_REF_LAYERS) gpu/aug.c gpu/common.c
FUZZ_CORPUS_config_patch := tests/fuzz/corpus_config_patch
FUZZ_SRC_jpeg_header := server/safetensors.c $(IMAGE_HEADER_SRC) server/text.c
FUZZ_CORPUS_jpeg_header := tests/fuzz/corpus_jpeg_header
FUZZ_SRC_png_header := server/safetensors.c $(IMAGE_HEADER_SRC) server/text.c
FUZZ_CORPUS_png_header := tests/fuzz/corpus_png_header
FUZZ_SRC_webp_header := server/safetensors.c $(IMAGE_HEADER_SRC) server/text.c
FUZZ_CORPUS_webp_header := tests/fuzz/corpus_webp_header
# the checkpoint decoder, on the whole-file reader, against the model it decodes for
FUZZ_SRC_checkpoint := server/safetensors.c $(IMAGE_HEADER_SRC) server/text.c server/checkpoint_format.c gpu/model.c gpu/layers.c gpu/layer_json.c gpu/layer_init.c $(FUZZ_REF_LAYERS) gpu/common.c
FUZZ_CORPUS_checkpoint := tests/fuzz/corpus_checkpoint
FUZZ_BINS := $(FUZZ_TARGETS:%=$(BUILD)/fuzz_%)
test-builds-side: $(FUZZ_BINS)
FUZZ_SMOKE_SECONDS ?= 15

fuzz_objs = $(patsubst %.c,$(BUILD)/fuzz-obj/%.o,$(FUZZ_SRC_$(1)))
# Kept after the link (make deletes the objects a chain of pattern rules made),
# so that the next build relinks only what changed.
.SECONDARY: $(sort $(foreach t,$(FUZZ_TARGETS),$(call fuzz_objs,$(t))))
$(BUILD)/fuzz-obj/%.o: %.c $(FLAVOUR_STAMP)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(CPPFLAGS) -MMD -MP -c $< -o $@

.SECONDEXPANSION:
$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $$(call fuzz_objs,$$*)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(CPPFLAGS) $^ -o $@ $(LDFLAGS) -lcjson -lm $(if $(filter %/server/tls.o,$^),-lgnutls -lmicrohttpd)

# Every target for FUZZ_SECONDS each (fuzz: 300 by default; fuzz-long: 3600, the
# runs tests/fuzz/RESULTS.md records). The script prints one result row per target.
fuzz: $(FUZZ_BINS)
	@bash tests/fuzz/run.sh $(BUILD) $${FUZZ_SECONDS:-300} $(foreach t,$(FUZZ_TARGETS),$(t):$(FUZZ_CORPUS_$(t)))
fuzz-long: $(FUZZ_BINS)
	@bash tests/fuzz/run.sh $(BUILD) $${FUZZ_SECONDS:-3600} $(foreach t,$(FUZZ_TARGETS),$(t):$(FUZZ_CORPUS_$(t)))
fuzz-smoke: $(FUZZ_BINS)
	@FUZZ_TARGETS_AT_ONCE=$(NPROC) bash tests/fuzz/run.sh $(BUILD) $(FUZZ_SMOKE_SECONDS) \
	  $(foreach t,$(FUZZ_TARGETS),$(t):$(FUZZ_CORPUS_$(t)))

gpu-test: $(if $(filter 1,$(CUDA)),$(GPU_TEST_BIN))
	@if [ "$(CUDA)" != 1 ]; then echo "SKIPPED gpu-test: built without CUDA ($(CUDA_WHY))"; \
	elif ! ls /dev/nvidia0 >/dev/null 2>&1; then echo "SKIPPED gpu-test: no GPU on this machine (CUDA code compiled: $(words $(GPU_TEST_BIN)) test binaries built)"; \
	else set -e; for t in $(GPU_TEST_BIN); do echo "== $$t"; $$t; done; fi

# The GPU tests under compute-sanitizer: memcheck (out-of-bounds and
# misaligned accesses, leaks of device memory), racecheck (shared-memory
# races), synccheck (barriers) and initcheck (reads of memory nothing wrote),
# one run per tool and program (test_ops: per op family), several at once
# under one deadline (tests/gpu/sanitize_tests.sh: its GPU_SANITIZE_* knobs
# narrow and bound it). Any report, failed test or unfinished run fails the
# target; tests/gpu/SANITIZER.md records the runs and the known sanitizer
# failures inside the libraries' kernels that it skips.
gpu-sanitize: $(if $(filter 1,$(CUDA)),$(GPU_TEST_BIN))
	@if [ "$(CUDA)" != 1 ]; then echo "SKIPPED gpu-sanitize: built without CUDA ($(CUDA_WHY))"; \
	elif ! ls /dev/nvidia0 >/dev/null 2>&1; then echo "SKIPPED gpu-sanitize: no GPU on this machine"; \
	else CUDA_HOME=$(CUDA_HOME) bash tests/gpu/sanitize_tests.sh $(BUILD); fi

# ---- run -------------------------------------------------------------------
# Without a GPU the CPU reference backend needs seconds to minutes per W1
# batch: `make run` starts the tiny model there (32x32x3, milliseconds per
# batch), so the README's first commands answer at once; the preset brings its
# own augmentation (docs/CONFIG.md, preset recipes). RUN_FLAGS= overrides.
CPU_RUN_FLAGS := --model.preset tiny
RUN_FLAGS ?= $(if $(wildcard /dev/nvidia0),,$(CPU_RUN_FLAGS))
# HOST=0.0.0.0 serves other machines too; the default serves this one only.
HOST ?= 127.0.0.1
run: $(BUILD)/streamfeed
	$(BUILD)/streamfeed --http.host $(HOST) --http.port $(PORT) $(RUN_FLAGS)

demo: $(BUILD)/streamfeed $(BUILD)/streamfeed-load
	@BUILD=$(BUILD) bash tools/demo.sh

BENCH_BIN := $(BUILD)/bench/memcpy_bw $(BUILD)/bench/loopback_bw $(if $(filter 1,$(CUDA)),$(BUILD)/bench/augment_bench $(BUILD)/bench/w1_cached $(BUILD)/bench/cached $(BUILD)/bench/jpeg_decode $(BUILD)/bench/layers_bench $(BUILD)/bench/cudnn_bn_fusion)
bench-bins: $(BENCH_BIN)
$(BUILD)/bench/memcpy_bw: bench/memcpy_bw.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -pthread $< -o $@
$(BUILD)/bench/loopback_bw: bench/loopback_bw.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -Wextra -Werror -pthread $< -o $@
$(BUILD)/bench/%: bench/%.cu $(LIB)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVCC_LDFLAGS) -DSF_HAVE_CUDA=1 $^ -o $@ -Xlinker -rpath,$(CUDA_LIBDIR) $(filter-out -lstdc++ -pthread,$(LDLIBS)) -lpthread
# W1's model-only figure is bench/cached.cu's executor way, which the program
# takes when started under this name (its header says how the two ways split).
$(BUILD)/bench/w1_cached: $(BUILD)/bench/cached
	ln -sfn cached $@

# Side-by-side benchmarks on a GPU host (PyTorch measured in the same run);
# results land in $(BENCH_OUT) (default build/bench-out) as JSON and report.md.
bench: $(BUILD)/streamfeed $(BUILD)/streamfeed-load bench-bins
	@bash bench/run.sh

# Ingest alone (sink mode, no GPU needed) on 1 and 8 connections next to
# memcpy and raw TCP loopback, measured in alternation in one run.
bench-ingest: $(BUILD)/streamfeed $(BUILD)/streamfeed-load $(BUILD)/bench/memcpy_bw $(BUILD)/bench/loopback_bw
	$(PYTHON) bench/ingest_ceiling.py --bench-dir $(BUILD)/bench --bin $(BUILD)/streamfeed --load $(BUILD)/streamfeed-load \
	  --json $(or $(BENCH_OUT),$(BUILD)/bench-out)/ingest_ceiling.json

# JPEG ingest on a GPU host: decode alone (each nvJPEG backend, torchvision,
# PIL), W1 from JPEG vs raw over HTTP, and the ImageNet-like ResNet-18 case;
# results in $(BENCH_OUT) (default build/bench-out/jpeg).
bench-jpeg: $(BUILD)/streamfeed $(BUILD)/streamfeed-load bench-bins
	@bash bench/jpeg_run.sh

# Data-parallel streamfeed on 1 and G GPUs beside PyTorch DDP (needs the GPUs;
# MG_CPU=1 bench/multi_gpu_run.sh is its smoke test on the CPU).
bench-multi-gpu: $(BUILD)/streamfeed $(BUILD)/streamfeed-load
	@bash bench/multi_gpu_run.sh

# docs/CONFIG.md is generated from the option table, docs/LAYERS.md from the layer-kind
# registry (gpu/layers.c); tests check both are current.
# deploy/base/prometheusrule.yaml is generated from deploy/prometheus/alerts.yaml.
docs: $(BUILD)/streamfeed
	$(BUILD)/streamfeed --help-markdown > docs/CONFIG.md
	$(BUILD)/streamfeed --help-layers > docs/LAYERS.md
	$(PYTHON) tools/gen_openapi_config.py $(BUILD)/streamfeed openapi/streamfeed.yaml
	$(PYTHON) tools/gen_prometheus_rule.py

clean:
	rm -rf $(BUILD)

# ---- dependencies ----------------------------------------------------------
deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then echo "deps: ✓ all Debian packages present"; \
	elif [ "$$(id -u)" = 0 ]; then echo "deps: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "deps: missing$$missing — run: sudo apt-get install -y$$missing"; exit 1; fi

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# Builds run on every core, so `make deps demo` would compile before the
# packages it installs are there, and `make clean all` while it deletes: with
# deps or clean among the goals, everything that compiles, links or installs
# waits for them.
FIRST_GOALS := $(filter clean deps,$(MAKECMDGOALS))
ifneq ($(FIRST_GOALS),)
$(filter-out $(FIRST_GOALS),$(MAKECMDGOALS)) $(FLAVOUR_STAMP) $(BUILD)/openapi_spec.o $(VENV)/.stamp $(FUZZ_BINS) $(NVJPEG_DEP): | $(FIRST_GOALS)
endif
