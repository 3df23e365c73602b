# `make demo` and `make test` create .venv with the pinned stack when it is missing, then run.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.frugal-installed

.PHONY: demo test venv bench clean

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
	$(PY) -m torchrec_frugal.demo

test: $(STAMP)
	$(PY) -m pytest -x -q tests

bench: $(STAMP)
	$(PY) benchmarks/bench_queue.py
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_dlrm.py
	$(PY) benchmarks/bench_graph.py

clean:
	rm -rf $(VENV) build *.egg-info
