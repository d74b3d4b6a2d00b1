# The README's two commands: `make demo` and `make test`. Both set up .venv first.
PY := .venv/bin/python
export OMP_NUM_THREADS ?= 1

.PHONY: setup demo test lint stress bench peer docs clean

# Everything the tests need (as root: system packages too); `make demo` installs only its part.
setup:
	@scripts/setup.sh full

demo:
	@scripts/setup.sh demo
	$(PY) scripts/demo.py

test: setup
	$(PY) -m ruff format --check sdk server_stub tests bench scripts
	$(PY) -m ruff check sdk server_stub tests bench scripts
	$(PY) -m mypy
	.venv/bin/lint-imports --no-cache
	$(PY) -m pytest tests

lint: setup
	$(PY) -m ruff format --check sdk server_stub tests bench scripts
	$(PY) -m ruff check sdk server_stub tests bench scripts
	$(PY) -m mypy
	.venv/bin/lint-imports --no-cache

stress: setup
	$(PY) -m pytest tests -m stress

bench: setup
	@$(PY) -c 'import matplotlib' 2>/dev/null || $(PY) -m pip install -q 'matplotlib>=3.7'
	$(PY) -m bench.run_all $(BENCH_ARGS)

# The browsable site: docs/ plus the API reference from the docstrings; --strict fails on a
# broken link or a stale name. Open build/site/index.html.
docs: setup
	$(PY) -m mkdocs build --strict --site-dir build/site

peer:
	@scripts/peer_lerobot.sh

clean:
	rm -rf .demo .bench build *.egg-info
