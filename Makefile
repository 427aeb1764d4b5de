PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SF ?= 0.1
BENCH_SF ?= 1

RGW_PACKAGES := radosgw ceph-mon ceph-osd

.PHONY: test demo bench clean rgw

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,bench,plot]'
	touch $(STAMP)

# a real S3 server for the object-store tests (Ceph RGW from Debian's packages; the tests start it on 127.0.0.1)
rgw:
	@command -v radosgw >/dev/null && command -v ceph-mon >/dev/null && command -v ceph-osd >/dev/null || { \
		echo "installing $(RGW_PACKAGES) (Debian's packages, as root)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			$(RGW_PACKAGES) >/dev/null; }

# two workers, each test file on one of them (its module fixtures shared): 23 minutes instead of 32 (docs/)
test: $(STAMP) rgw
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

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
	$(PY) benchmarks/object_store.py --scale-factors 0.1,$(BENCH_SF)

clean:
	rm -rf $(VENV) demo-data bench-data
