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

.PHONY: run test setup clean test-unit test-mpi opengate-check

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

# opengate (10.x) and its Geant4 libraries (~3 GB) in a venv of their own, never in make test's path. GATEONRTD=1
# keeps opengate's import from downloading Geant4 data sets (the stand-alone OptiGAN runs no Geant4).
# benchmarks/opengate_roundtrip.py trains nothing: it exports RUN's checkpoint (or scores model_3341.pt alone).
OG_VENV := .venv-opengate
OG_PY   := $(OG_VENV)/bin/python
OPENGATE_PIN ?= opengate>=10,<11
OG_ARGS ?=

$(OG_VENV)/.installed: pyproject.toml
	test -x $(OG_PY) || $(PYTHON) -m venv $(OG_VENV)
	$(OG_PY) -m pip install --quiet --upgrade pip
	$(OG_PY) -m pip install --quiet "$(TORCH_PIN)"
	$(OG_PY) -m pip install --quiet "$(OPENGATE_PIN)" uproot pandas
	$(OG_PY) -m pip install --quiet --no-deps -e .
	$(OG_PY) -m pip install --quiet h5py pyyaml tqdm matplotlib pytest
	touch $@

opengate-check: $(OG_VENV)/.installed
	GATEONRTD=1 timeout 1800 $(OG_PY) benchmarks/opengate_roundtrip.py $(OG_ARGS)
	GATEONRTD=1 timeout 600 $(OG_PY) -m pytest -q tests/test_opengate_roundtrip.py

clean:
	rm -rf $(VENV) $(OG_VENV) runs
