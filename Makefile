# Two commands for a fresh machine: `make run` (the demo) and `make test` (the whole suite).
VENV ?= .venv
PY := $(VENV)/bin/python
SPECDEC := $(VENV)/bin/specdec
# torch 2.13.0 is the CPU build available on local disk; the library itself only needs torch>=2.4.
TORCH_PIN ?= torch==2.13.0
PROMPT ?= def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n

.PHONY: setup models browser run test test-quick bench clean-venv

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

models: setup
	$(SPECDEC) models pull defaults
	$(SPECDEC) models pull smollm2-135m

# Debian's chromium, for the one test that renders the acceptance view (`generate --html`) in a real
# headless browser; without it that test is skipped (CI installs it and refuses the skip).
browser:
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { $$(command -v sudo) apt-get update -qq && $$(command -v sudo) apt-get install -y -qq --no-install-recommends chromium; }

run: models
	$(SPECDEC) generate --method draft_suffix --draft-model qwen2.5-coder-0.5b --num-speculative-tokens auto --explain --compare-plain --max-tokens 128 "$$(printf '$(PROMPT)')"

test: models
	$(PY) -m pytest

test-quick: setup
	$(PY) -m pytest -m "not slow" -q

clean-venv:
	rm -rf $(VENV)
