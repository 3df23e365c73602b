# `make demo` and `make test` create .venv with the pinned stack when it is missing, then run.
# `make test-compat` and `make test-latest` run the TorchRec tests against the other supported
# TorchRec releases (CONTRIBUTING.md, "Supported releases").
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.frugal-installed

# TorchRec 1.9.2 on its own stack (requirements-latest.txt), in a virtual environment of its own.
LATEST := .venv-latest
LATEST_PY := $(LATEST)/bin/python
LATEST_STAMP := $(LATEST)/.frugal-installed
# TorchRec 1.6.1 (pure Python) installed into a folder put first on the path of the pinned .venv:
# its own fbgemm-gpu-cpu 1.6.0 does not load with torch 2.13, so it runs on fbgemm-gpu-cpu 1.8.0.
COMPAT := .torchrec-1.6.1
COMPAT_STAMP := $(COMPAT)/.installed

# Everything that goes through TorchRec: the planner shims, planner, sharders, fused optimizers,
# pipeline, checkpoints, the swap example, and the DLRM and graph examples (the real-KG accuracy
# runs stay in make test).
TORCHREC_TESTS := $(wildcard tests/torchrec/test_torchrec_*.py) tests/examples/test_swap_example.py tests/examples/test_dlrm_train.py tests/examples/test_graph_train.py
PYTEST_TORCHREC := -m pytest -x -q -p no:cacheprovider $(TORCHREC_TESTS) -k "not real_kg"

.PHONY: demo test test-compat test-latest test-install venv bench clean

venv: $(STAMP)

$(STAMP): requirements-cpu.txt setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(PY) -m pip install -q $$(grep -v '^fbgemm-gpu-cpu' requirements-cpu.txt | grep -v '^#') fbgemm-gpu==1.8.0; \
	else \
	  $(PY) -m pip install -q -r requirements-cpu.txt; \
	fi
	$(PY) -m pip install -q --no-deps torchrec==1.8.0
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -c "import torch, fbgemm_gpu, torchrec, torchrec_frugal; print('stack:', torch.__version__, fbgemm_gpu.__version__, torchrec.__version__)"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -x -q --durations=30 tests

$(COMPAT_STAMP): $(STAMP)
	rm -rf $(COMPAT)
	$(PY) -m pip install -q --no-deps --target $(COMPAT) torchrec==1.6.1
	touch $(COMPAT_STAMP)

test-compat: $(COMPAT_STAMP)
	PYTHONPATH=$(CURDIR)/$(COMPAT) $(PY) -c "import torchrec; assert torchrec.__version__ == '1.6.1', torchrec.__version__"
	PYTHONPATH=$(CURDIR)/$(COMPAT) $(PY) $(PYTEST_TORCHREC)

$(LATEST_STAMP): requirements-latest.txt setup.cfg pyproject.toml
	test -x $(LATEST_PY) || $(PYTHON) -m venv $(LATEST)
	$(LATEST_PY) -m pip install -q --upgrade pip
	$(LATEST_PY) -m pip install -q -r requirements-latest.txt
	$(LATEST_PY) -m pip install -q --no-deps torchrec==1.9.2
	$(LATEST_PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(LATEST_PY) -c "import torch, fbgemm_gpu, torchrec; v = (torch.__version__.split('+')[0], fbgemm_gpu.__version__, torchrec.__version__); assert v == ('2.14.1', '1.9.0', '1.9.2'), v"
	touch $(LATEST_STAMP)

test-latest: $(LATEST_STAMP)
	$(LATEST_PY) $(PYTEST_TORCHREC)

# The wheel installed into a fresh venv (in a temporary directory, removed afterwards) by the CPU
# commands of docs/install.md, then the swap example and TorchRec tests run against it from outside
# the checkout (scripts/check_install.sh). Needs no .venv; about 5 minutes on 2 cores.
test-install:
	PYTHON=$(PYTHON) scripts/check_install.sh

bench: $(STAMP)
	$(PY) benchmarks/bench_queue.py
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_dlrm.py
	$(PY) benchmarks/bench_graph.py

clean:
	rm -rf $(VENV) $(LATEST) $(COMPAT) build dist *.egg-info
