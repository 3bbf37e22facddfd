# The README's two commands: `make demo` and `make test`. Both set everything up first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
PYTHON ?= python3
SOURCES := $(shell find npusnap_cli native -type f -not -name '*.pyc' -not -name _protocol.py 2>/dev/null) \
           pyproject.toml CMakeLists.txt scripts/gen_protocol.py

.PHONY: setup demo test cluster-test job-faults faults bench bench-incremental bench-job bench-lazy bench-live bench-quick criu zdtm completions man docs clean

setup: $(VENV)/.installed $(VENV)/.criu

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# The package (with its native parts) is rebuilt whenever a source changes.
$(VENV)/.installed: $(VENV)/bin/python $(SOURCES)
	bash scripts/install-build-deps.sh
	$(PIP) install -q scikit-build-core pybind11
	$(PIP) install -q --no-build-isolation '.[test]'
	touch $@

# CRIU >= 4.1 on PATH and pycriu in the venv (builds CRIU once; seconds afterwards).
$(VENV)/.criu: $(VENV)/bin/python scripts/install-criu.sh $(wildcard scripts/criu-patches/*.patch)
	bash scripts/install-criu.sh $(VENV)
	touch $@

criu: $(VENV)/bin/python
	bash scripts/install-criu.sh $(VENV)

demo: setup
	$(VENV)/bin/npusnap demo

test: setup
	$(VENV)/bin/pytest

# The multi-node Slurm test cluster's tests alone (scripts/test-cluster.sh; `make test` runs them
# too, and skips them when Slurm is missing): installs Slurm and munge first.
cluster-test: setup
	bash scripts/install-build-deps.sh cluster
	$(VENV)/bin/pytest tests/cluster -q

# npusnap job's fault tests (a failure at each stage, a worker killed, a foreign message) run
# JOB_FAULT_LOOPS times over on the test cluster, and 20 signals at random instants per variant
# (tests/job/test_interrupts.py); `make test` runs them once, and 3 signals.
JOB_FAULT_LOOPS ?= 5
job-faults: setup
	bash scripts/install-build-deps.sh cluster
	for i in $$(seq $(JOB_FAULT_LOOPS)); do $(VENV)/bin/pytest tests/job/test_faults.py -q -p no:cacheprovider || exit 1; done
	NPUSNAP_JOB_SIGINT=20 $(VENV)/bin/pytest tests/job/test_interrupts.py -q -p no:cacheprovider

# Signals at random moments of checkpoint and restore: 100 SIGINTs and 20 SIGSTOP/SIGCONT pauses
# (tests/faults/test_random_faults.py; NPUSNAP_FAULT_SEED=N replays a run), and 20 SIGINTs each
# into a process set's checkpoint and restore (tests/faults/test_processset_faults.py), and 40
# into a set checkpoint of HCCL ranks (2 ranks; 20 for 4; tests/hccl/test_inplace.py), and 40
# SIGKILLs of a set checkpoint or restore of examples/ddp's ranks (2 ranks; 20 for 4;
# tests/hccl/test_set_sigkill.py), and 40 signals into a live checkpoint's write-behind
# (tests/faults/test_live_faults.py), and 20 SIGINTs or SIGTERMs at random instants of a live set
# checkpoint of 3 processes (tests/faults/test_live_set_faults.py), and 20 SIGINTs each into a
# lazy restore of one process and of a set (tests/pipeline/test_lazy.py, test_lazy_set.py).
FAULT_SIGINT  ?= 100
FAULT_LIVE ?= 40
FAULT_LIVE_SET ?= 20
FAULT_SET_SIGINT ?= 20
FAULT_HCCL_SIGINT ?= 40
FAULT_SET_SIGKILL ?= 40
FAULT_SIGSTOP ?= 20
FAULT_LAZY ?= 20
faults: setup
	NPUSNAP_FAULT_SIGINT=$(FAULT_SIGINT) NPUSNAP_FAULT_SIGSTOP=$(FAULT_SIGSTOP) NPUSNAP_FAULT_SET_SIGINT=$(FAULT_SET_SIGINT) \
	NPUSNAP_FAULT_HCCL_SIGINT=$(FAULT_HCCL_SIGINT) NPUSNAP_FAULT_SET_SIGKILL=$(FAULT_SET_SIGKILL) NPUSNAP_FAULT_LIVE=$(FAULT_LIVE) \
		NPUSNAP_FAULT_LIVE_SET=$(FAULT_LIVE_SET) NPUSNAP_LAZY_SIGINT=$(FAULT_LAZY) \
		$(VENV)/bin/pytest tests/faults/test_random_faults.py tests/faults/test_processset_faults.py::test_sigint_at_random_instants_of_a_set_checkpoint_and_restore \
		tests/faults/test_live_faults.py tests/faults/test_live_set_faults.py \
		tests/pipeline/test_lazy.py::test_sigint_at_random_instants_of_a_lazy_restore \
		tests/pipeline/test_lazy_set.py::test_sigint_at_random_instants_of_a_lazy_set_restore \
		tests/hccl/test_inplace.py::test_sigint_at_random_instants_of_an_hccl_set_checkpoint tests/hccl/test_set_sigkill.py \
		-q -rs -p no:cacheprovider

# The full sweep draws bench/results.png with matplotlib (the `bench` extra), installed here when
# the index has it; without it the run still completes and says the plot was skipped.
bench: setup
	$(PY) -c 'import matplotlib' 2>/dev/null || $(PIP) install -q matplotlib || echo "bench: matplotlib unavailable"
	$(PY) -m bench

bench-job: setup
	$(PY) -m bench.job

bench-quick: setup
	$(PY) -m bench --quick

# checkpoint --live's downtime against a full --leave-running checkpoint (the full preset's size), each
# stopped phase's seconds too.
bench-live: setup
	$(PY) -m bench.live

# restore --lazy against the full restore on a 4 GiB job (LAZY_HOST + LAZY_DEVICE): first step after each.
LAZY_HOST ?= 512M
LAZY_DEVICE ?= 3584M
bench-lazy: setup
	$(PY) -m bench.lazy --host $(LAZY_HOST) --device $(LAZY_DEVICE)

# The second of two checkpoints (--parent, --dedup) after a tenth of a 4 GiB job changed, against the first.
bench-incremental: setup
	$(PY) -m bench.incremental

# CRIU's zdtm static tests, bare and through npusnap; fails if one passes bare only.
# ZDTM_TESTS=a,b picks tests (default: every one the CRIU tree has that runs in host mode here).
zdtm: setup
	bash scripts/install-build-deps.sh zdtm
	$(PY) scripts/zdtm.py $(if $(ZDTM_TESTS),--only $(ZDTM_TESTS))

# Generated from the click app, committed, and checked by tests/cli/test_{completions,docs}.py.
completions: $(VENV)/bin/python
	$(PY) scripts/gen_completions.py completions

man: $(VENV)/bin/python
	$(PY) scripts/gen_man.py docs/npusnap.1

docs: completions man

clean:
	rm -rf build $(VENV) npusnap_cli/_protocol.py
