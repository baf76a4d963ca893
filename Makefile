# The two commands: `make run` and `make test`. Both create .venv and install on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), sys.version' 2>/dev/null \
		|| { echo "make: Python 3.11 or newer is needed (set PYTHON=/path/to/python3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/wingsmith up \
		--simulated east=2x8:NVIDIA-H100-80GB-HBM3@rack-a \
		--simulated west=1x4:NVIDIA-H100-80GB-HBM3@rack-b

# Coverage counts the `wingsmith` processes the tests start as well ([tool.coverage.run] in
# pyproject.toml); a child that is killed (SIGKILL) rather than stopped adds nothing.
# The manifests' test renders them with `kubectl kustomize`: Debian's kubectl, if missing.
KUBECTL := $(shell command -v kubectl)

test: $(STAMP)
ifeq ($(KUBECTL),)
	apt-get update -qq && apt-get install -y -qq kubectl
endif
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	@rm -f .coverage .coverage.*
	$(BIN)/coverage run -m pytest -q --durations=20
	@$(BIN)/coverage combine -q
	@echo "coverage: $$($(BIN)/coverage report --format=total)% of wingsmith's lines, counting" \
		"the processes the tests start (per file: $(BIN)/coverage report)"

bench: $(STAMP)
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/replay.py
	$(BIN)/python bench/admission.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/api.py
	$(BIN)/python bench/cli.py

clean:
	rm -rf $(VENV) .wingsmith .pytest_cache .mypy_cache .hypothesis .coverage .coverage.* htmlcov
