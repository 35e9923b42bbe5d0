# CPU inference kit for TorchServe. `make serve` deploys, `make test` tests.
SHELL := /bin/bash
PY := .venv/bin/python
IPEX_PY := .venv-ipex/bin/python
comma := ,
CONFIG ?= optimized
# VARIANT: which archives to serve (config/variants/NAME.yaml); empty = the preset's own.
VARIANT ?=
ifdef BACKEND
$(warning BACKEND= is deprecated: it names a variant; use VARIANT=$(BACKEND))
VARIANT := $(BACKEND)
endif
BIND ?=
VARIANTS ?= eager,inductor
# Empty = every model file in config/models/ (kit/models.py).
MODELS ?=
PYTEST_ARGS ?=
# The container image: its tag, and the variants whose archives it carries.
IMAGE ?= localhost/kit-serve:latest
IMAGE_VARIANTS ?= inductor
export IMAGE

.PHONY: help test-tools test-image test-ipex test-container install install-ipex archive model serve itt-trace stop status image image-context image-start bench-preprocess bench-lengths bench-router bench-prefix bench-metrics bench-threads bench-decode bench-steadiness bench-load test test-archives test-archives-others test-archives-resnet50 test-archives-bert test-unit test-e2e lint format clean

help:
	@echo "make serve [CONFIG=optimized|baseline|tuned|path.yaml] [VARIANT=name] [MODELS=resnet50,bert] [BIND=0.0.0.0] [PROFILE_REQUESTS=N] [ITT_OPS=1] [ITT_TRACE=1] [MEMORY=6Gi]"
	@echo "make itt-trace   (after make serve ITT_TRACE=1: the workers' ITT ranges as logs/itt/trace.json)"
	@echo "make stop | status | archive | lint | format | clean | install-ipex"
	@echo "make test [LEAN=1] = test-unit, test-ipex, test-container, test-e2e in turn (LEAN=1 removes each part's own environment, archives and image after it)"
	@echo "make image [IMAGE=tag] [IMAGE_VARIANTS=inductor,aoti-int8] [MODELS=minilm] [BASE=image] | image-context (for docker build)"
	@echo "make image-start [MODELS=...] [ROUNDS=N] [IMAGE_VARIANTS=inductor for a language model]   (container start to ready, per cold-start option)"
	@echo "make bench [PLAN=quick|default|full|versus] | tune [MODELS=lm STREAMS=16 ITL_MS=150] | soak [SOAK_SECONDS=300] | bench-preprocess"
	@echo "make bench-steadiness [SECONDS=60]   (whether this machine keeps its speed: measure before you compare)"
	@echo "make bench-load SRC=hf-dir [DTYPES=float32,bfloat16] [WEIGHTS=packed,int8]   (a language model's load: its peak memory)"
	@echo "make bench-lengths [MODELS=all text models] [LENGTH_VARIANTS=inductor,openvino] [ROUNDS=3]   (which text length buckets pay)"
	@echo "make model NAME=mine SRC=hf-dir|model.pt2 [TASK=image-classification|text-classification|feature-extraction] [SAMPLES=...] [TOLERANCE=...] [SET='key=value ...'] [FORCE=1]"
	@echo "make doctor | profile MODEL=name [VARIANT=inductor]"
	@echo "(BACKEND= is the old spelling of VARIANT=, still understood)"

install:
	@bash scripts/install.sh

# .venv-ipex: torch 2.8 + Intel Extension for PyTorch 2.8 (its last release) for VARIANT=ipex.
install-ipex: install
	@bash scripts/install_ipex.sh

archive: install
	@$(PY) -m model_store.build $(if $(MODELS),--models $(MODELS)) --variants $(VARIANTS)

# Your own model: writes config/models/NAME.yaml, then builds its VARIANTS archives.
model: install
	@test -n "$(NAME)" -a -n "$(SRC)" || { echo "usage: make model NAME=mine SRC=hf-dir|model.pt2 [TASK=...] [SAMPLES=...] [TOLERANCE=...] [SET='key=value ...'] [FORCE=1]"; exit 2; }
	@$(PY) -m model_store.model_file $(NAME) $(SRC) $(if $(TASK),--task $(TASK)) $(if $(SAMPLES),--samples $(SAMPLES)) \
		$(if $(TOLERANCE),--tolerance $(TOLERANCE)) $(foreach setting,$(SET),--set $(setting)) $(if $(FORCE),--force)
	@$(PY) -m model_store.build --models $(NAME) --variants $(VARIANTS)

# The preset's archives plus VARIANT's (ipex and ipex-compile are served from .venv-ipex).
serve: VARIANTS := $(VARIANTS)$(if $(VARIANT),$(comma)$(VARIANT))
serve: archive
	@$(PY) -m kit serve --config $(CONFIG) $(if $(VARIANT),--variant $(VARIANT)) $(if $(BIND),--bind $(BIND)) \
		$(if $(PROFILE_REQUESTS),--profile-requests $(PROFILE_REQUESTS)) $(if $(ITT_OPS),--itt-ops) \
		$(if $(ITT_TRACE),--itt-trace) $(if $(MODELS),--models $(MODELS)) $(if $(MEMORY),--memory $(MEMORY))

# The ITT ranges the workers of `make serve ITT_TRACE=1` recorded, as a Perfetto/Chrome trace.
itt-trace:
	@$(PY) -m kit itt-trace

stop:
	@if [ -x $(PY) ]; then $(PY) -m kit stop; else echo "[stop] nothing installed, nothing running"; fi

status:
	@$(PY) -m kit status

# The serving image (Containerfile, docs/container.md); BASE empty = a Debian base
# bootstrapped here, BUILDER=docker to build with Docker.
image: VARIANTS = $(IMAGE_VARIANTS)
image: archive
	@VARIANTS=$(IMAGE_VARIANTS) MODELS=$(MODELS) bash scripts/image.sh

# The tests' image, a tag of its own: their container serves MiniLM alone, so it carries only
# MiniLM's archive (0.5 GB less than every model's, on a CI machine's disk).
TEST_IMAGE := localhost/kit-serve:test
test-image: IMAGE := $(TEST_IMAGE)
test-image: MODELS := minilm
test-image: image

# build/image/: what `docker build -t kit-serve build/image` builds.
image-context: VARIANTS = $(IMAGE_VARIANTS)
image-context: archive
	@VARIANTS=$(IMAGE_VARIANTS) MODELS=$(MODELS) bash scripts/image.sh --context-only

# Container start to ready: compile at start, a warm Inductor cache volume, precompiled aoti-int8.
image-start: IMAGE_VARIANTS := inductor,aoti-int8
image-start: image
	@$(PY) -m bench.studies.container_start $(if $(MODELS),--models $(MODELS)) $(if $(ROUNDS),--rounds $(ROUNDS))

# What the OpenAI router costs a request (why it has a port of its own): an embedder asked at its
# own path and through the router, in turns (bench/studies/router_cost.py).
bench-router: archive
	@$(PY) -m bench.studies.router_cost $(if $(MODELS),--models $(MODELS)) $(if $(ROUNDS),--rounds $(ROUNDS))

# A shared system prompt of 1,000 tokens: the first request's time to first token against the later ones';
# CONVERSATIONS=K: K conversations returning in turns instead.
bench-prefix: archive
	@$(PY) -m bench.studies.prefix_reuse --models $(MODELS) $(if $(ROUNDS),--rounds $(ROUNDS)) \
		$(if $(CONVERSATIONS),--conversations $(CONVERSATIONS)) $(if $(TOKENS),--tokens $(TOKENS))

# What a language model's decode step pays for kernels that read their thread count when they run
# (the kit's, so that shipped graphs serve any worker size) against kernels fixed to it (bench/studies/compiled_threads.py).
bench-threads: install
	@$(PY) -m bench.studies.compiled_threads --models $(MODELS) $(if $(ROUNDS),--rounds $(ROUNDS)) $(if $(THREADS),--threads $(THREADS))

# Where a language model's decode step goes, and a step with a prompt's part: its linear kernels
# against the rest, and the rate they read their weights at against a plain read
# (bench/studies/decode_split.py). VARIANT: the archive's (default: inductor).
bench-decode: VARIANTS := $(or $(VARIANT),inductor)
bench-decode: archive
	@$(PY) -m bench.studies.decode_split --models $(MODELS) $(if $(VARIANT),--variant $(VARIANT)) $(if $(ROUNDS),--rounds $(ROUNDS)) $(if $(STREAMS),--streams $(STREAMS))

# Whether this machine keeps its speed while measured: a read of memory and a Python loop, timed
# again and again with nothing else running (bench/studies/steadiness.py; a shared VM's host may not).
bench-steadiness: install
	@$(PY) -m bench.studies.steadiness $(if $(SECONDS),--seconds $(SECONDS))

# A language model's load as a worker does it, per served dtype and weights (bench/studies/load_memory.py).
bench-load: install
	@test -n "$(SRC)" || { echo "usage: make bench-load SRC=hf-dir [DTYPES=float32,bfloat16] [WEIGHTS=packed,int8]"; exit 2; }
	@$(PY) -m bench.studies.load_memory $(SRC) $(if $(DTYPES),--dtypes $(DTYPES)) $(if $(WEIGHTS),--weights $(WEIGHTS))

# What the kit's metrics cost a worker per request, clock on and off in turns (bench/studies/metrics_cost.py).
bench-metrics: install
	@$(PY) -m bench.studies.metrics_cost $(if $(ROUNDS),--rounds $(ROUNDS))

# The image handler's preprocessing per request, whole vs reduced JPEG decoding, by payload.
bench-preprocess: install
	@$(PY) -m bench.studies.preprocess

# Which text length buckets pay: one mix of texts in-process per bucket set (bench/studies/lengths.py).
LENGTH_VARIANTS ?= inductor,openvino
bench-lengths: VARIANTS = $(LENGTH_VARIANTS)
bench-lengths: archive
	@$(PY) -m bench.studies.lengths $(if $(MODELS),--models $(MODELS)) $(if $(ROUNDS),--rounds $(ROUNDS)) --variants $(LENGTH_VARIANTS)

# The archives the end-to-end part serves and checks. No test serves BERT's aoti-int8 (5 min to
# build): MiniLM's covers a text model on that backend. Those of the models the container part
# does not serve (test-archives-others: ResNet-50's, then BERT's; minutes on 2 cores) can be
# built while other parts run: .ci/run does, in the CPU time those parts leave.
test-archives: test-archives-others
	@$(PY) -m model_store.build --models minilm --variants eager,inductor,openvino-int8,aoti-int8
	@$(PY) -m model_store.build --models minilm --variants openvino-bf16 --where-supported

test-archives-others: test-archives-resnet50 test-archives-bert

test-archives-resnet50: install
	@$(PY) -m model_store.build --models resnet50 --variants eager,inductor,openvino-int8,aoti-int8
	@$(PY) -m model_store.build --models resnet50 --variants openvino-bf16 --where-supported

test-archives-bert: install
	@$(PY) -m model_store.build --models bert --variants eager,inductor,openvino-int8

# make test: four parts in turn, each bringing what it reads (.ci/run times each and prints the disk
# it peaked at). LEAN=1 (CI) removes what only one part reads once that part has passed: .venv-ipex
# and the ipex archives (4.9 GB), the tests' image and its build (2.8 GB), so that the disk holds
# one part's things at a time. Markers (pyproject.toml) say which part an e2e test belongs to.
test: test-unit test-ipex test-container test-e2e

# A test process per CPU this process may use (its CPU set, capped by a cgroup quota: kit/topology.py).
TEST_WORKERS ?= $(shell $(PY) -c 'from kit.topology import read_topology; t = read_topology(); \
	print(max(1, min(len(t.cpus), int(t.quota or len(t.cpus)))))' 2>/dev/null || echo 1)
# LEAN: Inductor's default cache, which in-process compiles fill (servers use .cache/inductor): the
# unit tests' 0.6 GB, the IPEX tests' (a precompiled header of 0.15 GB per torch and flags).
DEFAULT_INDUCTOR_CACHE = $${TMPDIR:-/tmp}/torchinductor_$$(id -un)
test-unit: install
	@$(PY) -m pytest tests/unit -n $(TEST_WORKERS) $(PYTEST_ARGS)
	@$(if $(LEAN),rm -rf "$(DEFAULT_INDUCTOR_CACHE)")

# IPEX: its backend tests in .venv-ipex, and the e2e tests that serve from it (marker ipex), which
# also build the archives they read (the bench's and your models' rows); two at a time as test-e2e.
test-ipex: install-ipex test-tools
	@$(PY) -m model_store.build --models resnet50,minilm --variants eager,ipex
	@$(IPEX_PY) -m pytest tests/ipex -p no:cacheprovider $(PYTEST_ARGS)
	@$(PY) -m pytest tests/e2e -m ipex -n $(E2E_JOBS) $(PYTEST_ARGS)
	@$(if $(LEAN),echo "[test] LEAN: removing .venv-ipex and the ipex archives and compile cache"; \
		rm -rf .venv-ipex model_store/ipex "$(DEFAULT_INDUCTOR_CACHE)")

# The tests' image run as a container (marker container); the eager MiniLM is their reference.
test-container: IMAGE := $(TEST_IMAGE)
test-container: test-image test-tools
	@$(PY) -m model_store.build --models minilm --variants eager
	@$(PY) -m pytest tests/e2e -m container $(PYTEST_ARGS)
	@$(if $(LEAN),bash scripts/image.sh --remove)

# Everything else against a real TorchServe, and the diagnosis tools on the real archives, in
# E2E_JOBS test processes, a module each at a time (a module's servers and archives are made once;
# modules make their models under names of their own; the modules on the session's optimized
# server are one group: tests/e2e/conftest.py draws them): a test waits on its server much of its
# time (with two processes, the e2e part of a fresh-clone CI at f3cbccd kept 2 CPUs 82 % busy).
# Tests marked serial compare rates over time: they run after, alone.
E2E_JOBS ?= 2
test-e2e: test-archives test-tools
	@$(PY) -m pytest tests/e2e tests/integration -m "not ipex and not container and not serial" \
		-n $(E2E_JOBS) $(PYTEST_ARGS)
	@$(PY) -m pytest tests/e2e -m "serial and not ipex and not container" $(PYTEST_ARGS)

# nginx for the auth proxy's tests on the host (scripts/test_tools.sh).
test-tools:
	@bash scripts/test_tools.sh

lint: install
	@$(PY) -m ruff check . && $(PY) -m ruff format --check .

format: install
	@$(PY) -m ruff format . && $(PY) -m ruff check --fix .

clean: stop
	rm -rf model_store/*/ logs .cache .pytest_cache

PLAN ?= default

.PHONY: bench tune soak doctor profile require-model
require-model:
	@test -n "$(MODEL)" || { echo "usage: make $(MAKECMDGOALS) MODEL=name [VARIANT=inductor] (a model of config/models/)"; exit 2; }
SOAK_SECONDS ?= 300
# Compare serving configurations with ab on the real server: bench/results/<time>/ (+ latest).
# The bench builds the archives of the variants its plan names.
# A plan is bench/plans/PLAN.yaml. PLAN=generate (kind: generate): a language model of yours
# (MODELS=lm) streamed against FastAPI + generate, llama.cpp's server and OpenVINO GenAI
# (bench/generate/run.py; llama.cpp is built, and OpenVINO GenAI's environment made, in .cache/peers/
# on first use), with ROUNDS= SECONDS= CONCURRENCY= PEERS= PRECISIONS= BACKENDS= WORKLOADS= over the file's.
# PLAN=generate-structured: the same rows free and under a JSON schema (structured output's cost).
# PLAN=generate-lookup MODELS=lm,lm-lookup: prompt lookup off and on, free text and a copy-heavy edit.
bench: install
	@$(PY) -m bench --plan $(PLAN) $(if $(MODELS),--models $(MODELS)) $(if $(ROUNDS),--rounds $(ROUNDS)) \
		$(if $(SECONDS),--seconds $(SECONDS)) $(if $(CONCURRENCY),--concurrency $(CONCURRENCY)) $(if $(PEERS),--peers $(PEERS)) \
		$(if $(PRECISIONS),--precisions $(PRECISIONS)) $(if $(BACKENDS),--backends $(BACKENDS)) $(if $(WORKLOADS),--workloads $(WORKLOADS))

# Search the layout and write the winner as config/presets/tuned.yaml: `make serve CONFIG=tuned`.
# A language model among MODELS: its variant and sequences per worker, measured at STREAMS
# concurrent streams (16), ROUNDS rounds (2) of SECONDS (30) each, within ITL_MS if given; then the
# winner with and without prompt lookup (LOOKUP drafted tokens, 4; 0: not tried) on WORKLOAD (text;
# copy: edits of their prompt), lookup served where it paid.
tune: install
	@$(PY) -m bench --plan tune --write-preset tuned $(if $(MODELS),--models $(MODELS)) $(if $(STREAMS),--streams $(STREAMS)) $(if $(ITL_MS),--itl-ms $(ITL_MS)) $(if $(ROUNDS),--lm-rounds $(ROUNDS)) $(if $(SECONDS),--lm-seconds $(SECONDS)) \
		$(if $(LOOKUP),--lookup $(LOOKUP)) $(if $(WORKLOAD),--workload $(WORKLOAD))

# Soak at concurrency 8, kill -9 a worker under load, restart on a warm cache: bench/results/soak-<time>/.
soak: archive
	@$(PY) -m bench.soak.run --seconds $(SOAK_SECONDS) $(if $(MODELS),--models $(MODELS))

# Which compiler stage breaks MODEL or changes its numbers; minified repro: logs/doctor/<model>-<time>/.
doctor: VARIANTS := $(or $(VARIANT),inductor)
doctor: MODELS := $(MODEL)
doctor: require-model archive
	@$(PY) -m diagnose doctor --model $(MODEL) --variant $(or $(VARIANT),inductor) $(if $(DEBUG_DUMP),--debug-dump)

# Eager vs VARIANT (default inductor) under torch.profiler (+ top-down where perf can): logs/profile/<model>-<time>/.
profile: VARIANTS := $(or $(VARIANT),inductor)
profile: MODELS := $(MODEL)
profile: require-model archive
	@$(PY) -m diagnose profile --model $(MODEL) --variant $(or $(VARIANT),inductor)
