# Quickstart targets. Each sets itself up in .venv inside the checkout.
# torch is installed only when it is not importable already, pinned so pip takes the local CPU build here;
# on a GPU machine install the CUDA build from pytorch.org into .venv first and these targets keep it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test test-fast install install-dev clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_PIN)"
	@touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e .
	@touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e ".[dev]"
	@touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(VENV)/bin/tropt diagnose --setup data/samples/sample_setup.py:make_setup \
		--split train=data/samples/train.csv --split test=data/samples/test.csv \
		--label churned --group customer_id --time signup_date \
		--fail-on never --no-progress --json reports/demo/findings.json --html reports/demo/report.html
	@echo "demo output: reports/demo/report.html and reports/demo/findings.json"

test: install-dev
	$(PY) -m pytest

test-fast: install-dev
	$(PY) -m pytest -m "not slow and not browser"

clean:
	rm -rf $(VENV) reports .pytest_cache build *.egg-info
