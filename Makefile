# Two promises on a fresh clone: `make run` and `make test`. Both set themselves up (idempotently).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
MPIEXEC = $(shell test -x $(VENV)/bin/mpiexec && echo $(VENV)/bin/mpiexec || command -v mpiexec)
# The CPU build of torch is pinned here (not in the package metadata): an unpinned torch pulls a CUDA build of GBs.
TORCH_PIN ?= torch==2.13.0
NP ?= 4
OUT ?= runs/quick
ARGS ?=

.PHONY: run test setup clean test-unit test-mpi

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[test,mpich]"
	touch $@

setup: $(VENV)/.installed

# The main job on the embedded default: 4 ranks posing as 2 nodes x 2 GPUs, mode rma-arar-arar, the quick preset.
run: setup
	timeout 3600 $(MPIEXEC) -n $(NP) $(PY) -m sagips.run --config configs/proxy1d-quick.yaml \
	  --mode rma-arar-arar --set comm.inner_size=2 --output-dir $(OUT) --overwrite $(ARGS)

test: setup
	$(PY) tests/run_all.py

test-unit: setup
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) runs
