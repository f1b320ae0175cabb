# marin-assets: `make demo` and `make test` are the quick start; both install first.
# Python 3.12 (Levanter's living line needs it): PYTHON if given, else python3.12 on the PATH, else one that
# pyenv installed (its `python3.12` shim runs only for a selected version), else python3 if it is 3.12.
PY_VERSION := 3.12
PYTHON ?= $(shell bash bin/find-python $(PY_VERSION))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export JAX_PLATFORMS ?= cpu
export HF_HUB_OFFLINE ?= 1
export RAY_AUTH_MODE ?= disabled

.PHONY: install demo test lint docs dev bench lock clean

install: $(STAMP) .env

$(STAMP): requirements.lock pyproject.toml
	@test -n "$(PYTHON)" || { echo "marin-assets needs Python $(PY_VERSION) and none was found: install it (Debian/Ubuntu: apt install python$(PY_VERSION) python$(PY_VERSION)-venv; macOS: brew install python@$(PY_VERSION); or pyenv install $(PY_VERSION)), or run make PYTHON=/path/to/python$(PY_VERSION)" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; v = "%d.%d" % sys.version_info[:2]; assert v == "$(PY_VERSION)", f"marin-assets needs Python $(PY_VERSION); $(PYTHON) is {v}"'
	@# A venv made by another Python (the 3.11 of releases before 0.2) is remade, not patched.
	@test ! -x $(BIN)/python || $(BIN)/python -c 'import sys; assert "%d.%d" % sys.version_info[:2] == "$(PY_VERSION)"' 2>/dev/null || { echo "$(VENV) was made by another Python: remaking it with $(PYTHON)"; rm -rf $(VENV); }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

# The instance's dagster.yaml (marin_assets/dagster/instance.py): no telemetry, no "Join the Dagster community"
# modal (nux) on the UI's first visit, so `make dev` opens on the asset graph, and the run queue's and run
# retries' settings that keep queued work through a daemon restart or a slow code server. A file that exists
# keeps its settings and gains the keys it lacks.
define instance_yaml
	$(BIN)/python -m marin_assets.dagster.instance $(1)
endef

# Dagster's CLI (and dg) loads ./.env before its instance: plain `.venv/bin/dagster dev`, `dg dev` or
# `dagster asset materialize` from the root then use the project-local instance too
# (an exported DAGSTER_HOME still wins).
.env:
	$(call instance_yaml,.dagster_home/dagster.yaml)
	printf 'DAGSTER_HOME=$${DAGSTER_HOME:-%s}\n' "$(CURDIR)/.dagster_home" > $@

# Remade when the Makefile changes, so an instance made before nux was set gains it.
$(DAGSTER_HOME)/dagster.yaml: Makefile
	$(call instance_yaml,$@)
	touch $@

demo: install $(DAGSTER_HOME)/dagster.yaml
	@# Quiet: a line per asset, the training loss as it falls, a summary; what Dagster, Ray, JAX and the steps print
	@# goes to $(DAGSTER_HOME)/logs/ (the runs' events are in the instance and the UI). --verbose prints it all.
	@$(BIN)/marin-assets materialize -f definitions.py --select '*hello/report,*exports/python-docs-llama,*evals/python-docs-llama,*evals/python-docs-llama-harness'
	@echo
	@echo "Every checkpoint's evaluations: one tick of the checkpoint sensor, without the daemon"
	@$(BIN)/marin-assets tick marin_checkpoint_evals
	@echo
	@echo "Where the outputs are (a second 'make demo' computes nothing: every asset cached: true):"
	@$(BIN)/marin-assets status -f definitions.py --select '*hello/report,*exports/python-docs-llama,*evals/python-docs-llama,*evals/python-docs-llama-harness'
	@echo
	@echo "Open the UI:  make dev   then browse http://127.0.0.1:3000/asset-groups  (DAGSTER_HOME=$(DAGSTER_HOME))"

dev: install $(DAGSTER_HOME)/dagster.yaml
	@echo "The asset graph: http://127.0.0.1:3000/asset-groups"
	$(BIN)/dagster dev -h 127.0.0.1 -p 3000

# Two workers (pytest-xdist), a file at a time each, longest files first (tests/conftest.py): in one process the
# suite used about 0.7 of 2 cores (servers starting, daemons polling, kills awaited); two take 15 min, not 31.
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# ruff (pyflakes, pycodestyle, import order, bugbear, pyupgrade), mypy (strict on the protocol),
# and the import-layer contracts (pyproject.toml [tool.importlinter]).
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml: docs/ and the API reference from the docstrings) into site/, warnings as
# errors. `.venv/bin/mkdocs serve` serves it while you edit. NO_MKDOCS_2_WARNING: no banner about MkDocs 2.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python bench/run.py

lock:
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^marin-assets' | \
	  sed '1i # Pinned environment CI tested: regenerate with '"'"'make lock'"'"' after changing pyproject.toml.' > requirements.lock

clean:
	rm -rf outputs .dagster_home
