# The two commands a new user needs: `make simulate` and `make test`. Each sets up a virtual
# environment in .venv (once; again when pyproject.toml changes) and then does its job.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out

.PHONY: setup simulate test lint native k8s bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# The main job: the simulator on the bundled Alibaba trace, the default policy beside the
# published baselines; prints the table, writes $(OUT)/simulation.png and .json.
simulate: setup
	mkdir -p $(OUT)
	$(BIN)/gpushare simulate --policy fgd-pack fgd best-fit \
		--plot $(OUT)/simulation.png --json $(OUT)/simulation.json

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

# The interception library, the mock CUDA driver and NVML, and the C test programs, plain and
# under the sanitizers (needs a C compiler and libcjson-dev).
native:
	$(MAKE) -C native all testing asan tsan

# etcd, kube-apiserver and kube-scheduler built from their Go modules into a cache outside the
# tree (a few minutes the first time, instant afterwards); the cluster tests run them.
k8s:
	scripts/k8s-binaries >/dev/null

test: setup lint native k8s
	$(BIN)/pytest

bench: setup
	$(BIN)/python bench/bench_simulate.py

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .ruff_cache .hypothesis
	$(MAKE) -C native clean
