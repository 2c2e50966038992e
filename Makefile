# ModelForge: `make run` brings up the whole platform; `make test` runs every check. Nothing else is
# assumed on the machine but Python 3.11 and make (Debian's chromium is installed for browser tests).

# The interpreter .venv is made from: the distribution's own Python 3.11 where it can make a venv (Debian's
# is built with profile-guided and link-time optimisation, as the python:3.11 image the Dockerfile ships
# is; a pyenv build is not: the gateway bench measured 16 % less CPU per request on Debian's,
# docs/DECISIONS.md 2026-12-06), else the first python3.11 or python3 on PATH. PYTHON=... overrides.
PYTHON ?= $(firstword $(foreach p,/usr/bin/python3.11 $(shell command -v python3.11) $(shell command -v python3),\
	$(shell test -x $(p) && $(p) -c 'import ensurepip, venv' 2>/dev/null && echo $(p))))
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install browser compose-tool services-up services-down lint clean engines test-engines

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The node agent is its own distribution (agent/pyproject.toml, on no index): installed from ./agent in
# the same command as the control plane that depends on it.
$(VENV)/.installed: pyproject.toml agent/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./agent -e '.[embedded,test,dev]'
	@# A virtualenv made before the agent was its own distribution: removing the old package took the
	@# agent's console script with it (its file list named the script). Put it back.
	@test -x $(BIN)/modelforge-agent || $(BIN)/python -m pip install --quiet --no-deps --force-reinstall -e ./agent
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/python -m modelforge run

# Browser tests drive Debian's chromium through Playwright (its own browser download is not used).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Compose rendering tests (tests/test_compose_render.py) use Debian's docker-compose: it renders
# `config` without a container engine.
compose-tool:
	@command -v docker-compose >/dev/null 2>&1 || { \
	  echo "installing Debian's docker-compose for the Compose rendering tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null; }

# make test serves real generated text from a real model (the engines below), as CI does.
test: install browser compose-tool $(VENV)/.engines
	MODELFORGE_TEST_ENGINES=1 $(BIN)/python -m modelforge.devstack test $(PYTEST_ARGS)

# A real engine for the local node: llama.cpp's OpenAI-compatible server and the Gemma 3 270M GGUF, put
# where make run's local agent finds its models. llama.cpp is compiled once (several minutes) for no
# particular CPU (no -march=native, no AVX-512, no AMX: a binary built for the build machine's CPU dies
# with SIGILL on a node that cannot run one of its instructions) and the wheel is kept in ENGINE_CACHE,
# outside the clone, so later installs and fresh clones take it in seconds.
ENGINE_CACHE ?= $(or $(XDG_CACHE_HOME),$(if $(HOME),$(HOME)/.cache,/tmp))/modelforge/engines
ENGINE_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
	-DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF
LLAMA_CPP := llama-cpp-python==0.3.36

$(VENV)/.engines: pyproject.toml | $(VENV)/.installed
	@mkdir -p $(ENGINE_CACHE)
	@ls $(ENGINE_CACHE)/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1 || { \
	  echo "compiling llama.cpp for a portable CPU target (once; cached in $(ENGINE_CACHE))"; \
	  CMAKE_ARGS="$(ENGINE_CMAKE_ARGS)" $(BIN)/python -m pip wheel --quiet --no-deps '$(LLAMA_CPP)' \
	    -w $(ENGINE_CACHE); }
	$(BIN)/python -m pip install --quiet $(ENGINE_CACHE)/llama_cpp_python-0.3.36-*.whl
	$(BIN)/python -m pip install --quiet -e '.[engines]'
	touch $@

engines: $(VENV)/.engines
	$(BIN)/python manage.py install_demo_gguf --models-dir $${MODELFORGE_HOME:-.modelforge}/agent/volume/models

# Only the real-engine tests.
test-engines: engines browser
	MODELFORGE_TEST_ENGINES=1 $(BIN)/python -m modelforge.devstack test -m engine $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy modelforge apps agent \
		&& $(BIN)/mypy --explicit-package-bases bench

services-up: install
	@$(BIN)/python -m modelforge.devstack up

services-down: install
	@$(BIN)/python -m modelforge.devstack down

clean:
	rm -rf .modelforge-test
