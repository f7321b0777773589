# streamfeed — build, test, run.
#
#   make              build/streamfeed (CUDA backend when nvcc is found; CUDA=0 forces CPU-only)
#   make test         unit tests (cmocka), integration tests (pytest), fuzz smoke run
#   make demo         the main job: server + streamfeed-load training on the learnable task
#   make run          start the server with the default config
#   make gpu-test     CUDA ops against the reference (needs a GPU; skips visibly without)
#   make bench        side-by-side benchmarks (needs a GPU)
#   make fuzz         every parser under libFuzzer (clang), FUZZ_SECONDS each (300)
#   make fuzz-long    the same, an hour each (FUZZ_SECONDS=3600): tests/fuzz/RESULTS.md
#   make soak         32 connections of mixed traffic for SOAK_SECONDS (600), checked
#   make deps         install the Debian packages (root), or print the command
#
# Options: CUDA=0|1  CUDA_ARCH=sm_90  DEPS_PREFIX=/opt/deps/usr  SANITIZE=address|undefined
#          DEBUG=1   PORT=8080

SHELL := /bin/bash
.DEFAULT_GOAL := all

BUILD   ?= build
CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
ifeq ($(origin CUDA),undefined)
  CUDA := $(if $(NVCC),1,0)
endif
CUDA_ARCH ?= sm_90
PORT    ?= 8080
PYTHON  ?= python3
VENV    := .venv

DEB_PKGS := libmicrohttpd-dev libgnutls28-dev libcjson-dev libcurl4-openssl-dev libcmocka-dev prometheus clang libclang-rt-14-dev pkg-config openssl

CPPFLAGS += -I. -D_GNU_SOURCE
CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -pthread -MMD -MP
LDLIBS   += -lmicrohttpd -lgnutls -lcjson -lcurl -lm -lpthread

ifdef DEBUG
  CFLAGS += -O0
endif
ifdef SANITIZE
  CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
  LDFLAGS += -fsanitize=$(SANITIZE)
endif
ifdef DEPS_PREFIX
  CPPFLAGS += -I$(DEPS_PREFIX)/include
  LDFLAGS  += -L$(DEPS_PREFIX)/lib/x86_64-linux-gnu -Wl,-rpath,$(DEPS_PREFIX)/lib/x86_64-linux-gnu
  NVCC_LDFLAGS += -I$(DEPS_PREFIX)/include -L$(DEPS_PREFIX)/lib/x86_64-linux-gnu -Xlinker -rpath,$(DEPS_PREFIX)/lib/x86_64-linux-gnu
endif

# ---- sources ---------------------------------------------------------------
SERVER_SRC  := $(filter-out server/main.c,$(wildcard server/*.c))
HANDLER_SRC := $(wildcard handlers/*.c)
GPU_SRC     := $(wildcard gpu/*.c) $(wildcard gpu/ref/*.c)
ifeq ($(CUDA),1)
  CUDA_C_SRC  := $(wildcard gpu/cuda/*.c)
  CUDA_CU_SRC := $(wildcard gpu/cuda/*.cu)
  CPPFLAGS    += -DSF_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  NVCCFLAGS   ?= -O3 -lineinfo
  NVCCFLAGS   += -std=c++17 -arch=$(CUDA_ARCH) -I. -Xcompiler -Wall,-Wno-unused-parameter
  CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib))
  LDFLAGS     += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR)
  LDLIBS      += -lcudnn -lcublasLt -lcublas -lcudart -lstdc++ -ldl -lrt
  BACKEND_NAME := cuda
else
  CUDA_C_SRC  :=
  CUDA_CU_SRC :=
  GPU_SRC     += gpu/nocuda/backend_nocuda.c
  BACKEND_NAME := ref
endif

LIB_C_SRC := $(SERVER_SRC) $(HANDLER_SRC) $(GPU_SRC) $(CUDA_C_SRC)
LIB_OBJ   := $(LIB_C_SRC:%.c=$(BUILD)/%.o) $(CUDA_CU_SRC:%.cu=$(BUILD)/%.cu.o) $(BUILD)/openapi_spec.o
LIB       := $(BUILD)/libstreamfeed.a

UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
GPU_TEST_SRC := $(wildcard tests/gpu/test_*.c) $(wildcard tests/gpu/test_*.cu)
GPU_TEST_BIN := $(patsubst tests/gpu/%.cu,$(BUILD)/tests/gpu/%,$(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(GPU_TEST_SRC)))

VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
CPPFLAGS += -DSF_BACKEND_BUILT=\"$(BACKEND_NAME)\"
# Only these objects carry the version, so a new commit does not rebuild everything.
$(BUILD)/server/app.o $(BUILD)/server/main.o: CPPFLAGS += -DSF_VERSION=\"$(VERSION)\"
$(BUILD)/server/app.o $(BUILD)/server/main.o: .FORCE
.FORCE:

.PHONY: client-test bench-bins ops-test deploy-render docker-image sanitize-test docs all test unit integration fuzz fuzz-long fuzz-smoke soak demo run gpu-test bench clean deps venv check-tools print-found
all: print-found $(BUILD)/streamfeed $(BUILD)/streamfeed-load $(UNIT_BIN)

print-found:
	@printf '%s\n' "streamfeed build: $(if $(filter 1,$(CUDA)),✓ nvcc ($(NVCC)) → CUDA backend ($(CUDA_ARCH)),✗ nvcc → CPU reference backend only)"
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

$(BUILD)/%.cu.o: %.cu $(FLAVOUR_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -DSF_HAVE_CUDA=1 -MMD -MP -c $< -o $@

# The spec is linked into the binary (GET /openapi.yaml serves it).
$(BUILD)/openapi_spec.o: openapi/streamfeed.yaml
	@mkdir -p $(dir $@)
	ld -r -b binary -z noexecstack -o $@ $<

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/streamfeed: $(BUILD)/server/main.o $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/streamfeed-load: $(BUILD)/client/streamfeed-load.o $(LIB)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lcmocka

$(BUILD)/tests/gpu/%: tests/gpu/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/gpu/%: tests/gpu/%.cu tests/gpu/gpu_test.h $(LIB)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVCC_LDFLAGS) -DSF_HAVE_CUDA=1 $(filter-out %.h,$^) -o $@ -Xlinker -rpath,$(CUDA_LIBDIR) $(filter-out -lstdc++ -pthread,$(LDLIBS)) -lpthread

# ---- tests -----------------------------------------------------------------
test: all unit integration client-test sanitize-test ops-test fuzz-smoke gpu-test
	@echo "make test: all suites passed"

unit: $(UNIT_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done

# One virtualenv for every Python test suite (integration, client, contract, ops).
REQS := $(wildcard tests/requirements*.txt)
$(VENV)/.stamp: $(REQS)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q $(addprefix -r ,$(REQS))
	@touch $@
venv: $(VENV)/.stamp

integration: $(BUILD)/streamfeed $(BUILD)/streamfeed-load $(VENV)/.stamp
	STREAMFEED_BIN=$(abspath $(BUILD)/streamfeed) STREAMFEED_LOAD=$(abspath $(BUILD)/streamfeed-load) \
	  $(VENV)/bin/python -m pytest -q tests/integration

# The Python client against the real binary; the API contract (schemathesis)
# and a real Prometheus scraping the service.
client-test: $(BUILD)/streamfeed $(VENV)/.stamp
	STREAMFEED_BIN=$(abspath $(BUILD)/streamfeed) $(VENV)/bin/python -m pytest -q -rs -p no:cacheprovider tests/client tests/contract

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
SAN_BUILD := $(BUILD)/asan
sanitize-test: $(VENV)/.stamp
	$(MAKE) --no-print-directory CUDA=0 SANITIZE=address,undefined BUILD=$(SAN_BUILD) \
	  $(SAN_BUILD)/streamfeed $(SAN_BUILD)/streamfeed-load
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
	  STREAMFEED_BIN=$(abspath $(SAN_BUILD)/streamfeed) STREAMFEED_LOAD=$(abspath $(SAN_BUILD)/streamfeed-load) \
	  $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/integration
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
FUZZ_CC ?= clang
FUZZ_FLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
FUZZ_TARGETS := safetensors config_patch
FUZZ_SRC_safetensors := server/safetensors.c
FUZZ_CORPUS_safetensors := tests/fuzz/corpus
FUZZ_SRC_config_patch := server/config.c gpu/model.c gpu/aug.c gpu/common.c
FUZZ_CORPUS_config_patch := tests/fuzz/corpus_config_patch
FUZZ_BINS := $(FUZZ_TARGETS:%=$(BUILD)/fuzz_%)
FUZZ_SMOKE_SECONDS ?= 15

.SECONDEXPANSION:
$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $$(FUZZ_SRC_$$*)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(CPPFLAGS) $^ -o $@ $(LDFLAGS) -lcjson -lm

# Every target for FUZZ_SECONDS each (fuzz: 300 by default; fuzz-long: 3600, the
# runs tests/fuzz/RESULTS.md records). The script prints one result row per target.
fuzz: $(FUZZ_BINS)
	@bash tests/fuzz/run.sh $(BUILD) $${FUZZ_SECONDS:-300} $(foreach t,$(FUZZ_TARGETS),$(t):$(FUZZ_CORPUS_$(t)))
fuzz-long: $(FUZZ_BINS)
	@bash tests/fuzz/run.sh $(BUILD) $${FUZZ_SECONDS:-3600} $(foreach t,$(FUZZ_TARGETS),$(t):$(FUZZ_CORPUS_$(t)))
fuzz-smoke: $(FUZZ_BINS)
	@bash tests/fuzz/run.sh $(BUILD) $(FUZZ_SMOKE_SECONDS) $(foreach t,$(FUZZ_TARGETS),$(t):$(FUZZ_CORPUS_$(t)))

gpu-test: $(if $(filter 1,$(CUDA)),$(GPU_TEST_BIN))
	@if [ "$(CUDA)" != 1 ]; then echo "SKIPPED gpu-test: built without CUDA (no nvcc)"; \
	elif ! ls /dev/nvidia0 >/dev/null 2>&1; then echo "SKIPPED gpu-test: no GPU on this machine (CUDA code compiled: $(words $(GPU_TEST_BIN)) test binaries built)"; \
	else set -e; for t in $(GPU_TEST_BIN); do echo "== $$t"; $$t; done; fi

# ---- run -------------------------------------------------------------------
run: $(BUILD)/streamfeed
	$(BUILD)/streamfeed --http.port $(PORT)

demo: $(BUILD)/streamfeed $(BUILD)/streamfeed-load
	@bash tools/demo.sh

BENCH_BIN := $(BUILD)/bench/memcpy_bw $(if $(filter 1,$(CUDA)),$(BUILD)/bench/augment_bench $(BUILD)/bench/w1_cached $(BUILD)/bench/cached)
bench-bins: $(BENCH_BIN)
$(BUILD)/bench/memcpy_bw: bench/memcpy_bw.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -pthread $< -o $@
$(BUILD)/bench/%: bench/%.cu $(LIB)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVCC_LDFLAGS) -DSF_HAVE_CUDA=1 $^ -o $@ -Xlinker -rpath,$(CUDA_LIBDIR) $(filter-out -lstdc++ -pthread,$(LDLIBS)) -lpthread

# Side-by-side benchmarks on a GPU host (PyTorch measured in the same run);
# results land in $(BENCH_OUT) (default build/bench-out) as JSON and report.md.
bench: $(BUILD)/streamfeed $(BUILD)/streamfeed-load bench-bins
	@bash bench/run.sh

# docs/CONFIG.md is generated from the option table; tests check it is current.
docs: $(BUILD)/streamfeed
	$(BUILD)/streamfeed --help-markdown > docs/CONFIG.md
	$(PYTHON) tools/gen_openapi_config.py $(BUILD)/streamfeed openapi/streamfeed.yaml

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
