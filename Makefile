PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SF ?= 0.1
BENCH_SF ?= 1

.PHONY: test demo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,bench,plot]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

demo: $(STAMP)
	$(VENV)/bin/metatable demo --scale-factor $(SF)

bench: $(STAMP)
	$(PY) benchmarks/mdt_lookup.py
	$(PY) benchmarks/log_blocks.py
	$(PY) benchmarks/peers.py --scale-factor $(BENCH_SF)
	$(PY) benchmarks/bulk_load.py --scale-factors $(BENCH_SF)
	$(PY) benchmarks/upsert.py --scale-factor $(BENCH_SF)
	$(PY) benchmarks/lookup.py --scale-factor $(BENCH_SF)
	$(PY) benchmarks/clustering.py --scale-factor $(BENCH_SF)
	$(PY) benchmarks/resize.py --scale-factor $(BENCH_SF)
	$(PY) benchmarks/indexer.py --scale-factor $(BENCH_SF)
	$(PY) benchmarks/chaos.py

clean:
	rm -rf $(VENV) demo-data bench-data
