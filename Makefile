# minitransformer: every command a reader or maintainer needs (`make help` prints this list;
# one line per target). See README.md.
#   make install     create .venv/ from requirements.lock (the targets below do it if needed)
#   make install-unlocked  create .venv/ from requirements.txt, for a Python the lock does not cover
#   make book        build the HTML book into _build/html/ (installs first if needed)
#   make test        run the unit tests and every notebook under nbval (installs first if needed)
#   make test-portable  replay every notebook as other CPUs compute: outputs must not change
#   make test-wheel  install the built wheel into a fresh venv and run the training chapter there
#   make check-html  check every page of the built book in Chromium, at 1280 and 390 px (builds it if missing)
#   make check-lab   check every chapter in JupyterLab in Chromium, before and after Run All
#   make chromium    install Debian's Chromium for the browser checks, if it is missing
#   make lint        ruff and ruff format on the code and notebooks, mypy and pyright, actionlint and zizmor
#   make lab         JupyterLab on book/
#   make serve       serve _build/html on http://127.0.0.1:8000
#   make notebooks   re-execute the notebooks in place (one: NOTEBOOKS=book/NAME.ipynb)
#   make bench       run the benchmarks in benchmarks/
#   make lock        re-resolve requirements.txt into requirements.lock (every version, hashed)
#   make clean       remove build outputs (keeps .venv/)
#   make distclean   remove build outputs and .venv/
#   make help        list these commands

# Windows (Git Bash or MSYS make): `python` and .venv/Scripts. The README's tested way on
# Windows is WSL, where this is Linux.
ifeq ($(OS),Windows_NT)
PYTHON ?= python
BIN    := .venv/Scripts
else
PYTHON ?= python3
BIN    := .venv/bin
endif
VENV   := .venv
STAMP  := $(VENV)/.installed
PORT   ?= 8000
# Notebooks in reading order, from _toc.yml.
NOTEBOOKS = $(shell sed -n 's/^ *- file: *\(book\/[^ ]*\)/\1/p' _toc.yml | while read f; do [ -f $$f.ipynb ] && echo $$f.ipynb; done)

.PHONY: install install-unlocked book test test-portable test-wheel lint chromium check-html check-lab lab serve notebooks bench lock clean distclean help

install: $(STAMP)

PIP_VERSION := 26.3
UV_VERSION  := 0.13.8
# Where the CPU build of torch (2.13.0+cpu, Linux x86-64, CPython 3.11) comes from: this
# machine's wheel folder if pip has one ($$PIP_FIND_LINKS), else PyTorch's CPU index. The lock
# pins its hash either way.
TORCH_INDEX := $(if $(PIP_FIND_LINKS),,--extra-index-url https://download.pytorch.org/whl/cpu)

# Every package at the version and hash of requirements.lock (the pins of requirements.txt and
# all they pull in, for each platform and Python of scripts/lock.py), then this package itself,
# editable. An interpreter the lock does not cover stops here with what to do instead.
$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) scripts/lock.py covers
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet pip==$(PIP_VERSION)
	$(BIN)/python -m pip install --require-hashes --no-deps $(TORCH_INDEX) -r requirements.lock
	$(BIN)/python -m pip install --no-deps -e .
	touch $(STAMP)

# For an interpreter the lock does not cover: the direct pins of requirements.txt (and this
# package, editable), resolved by pip. It writes the same marker, so later targets use it.
install-unlocked:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet pip==$(PIP_VERSION)
	$(BIN)/python -m pip install -r requirements.txt
	touch $(STAMP)

# Re-resolve requirements.txt into requirements.lock for every covered platform and Python
# (scripts/lock.py), with uv in a throwaway environment.
lock:
	$(PYTHON) -m venv _build/lock-venv
	_build/lock-venv/$(notdir $(BIN))/python -m pip install --quiet uv==$(UV_VERSION)
	$(PYTHON) scripts/lock.py compile _build/lock-venv/$(notdir $(BIN))/uv

book: $(STAMP)
	rm -rf _build/html _build/jupyter_execute
	$(BIN)/jupyter-book build . --builder html -W -n --keep-going
	@echo
	@echo "The book is at $(CURDIR)/_build/html/index.html"

# On both cores: two pytest workers, each notebook kept on one (--dist loadfile), each with one
# torch thread (two workers of two threads each spin-wait on two cores and take twice the CPU
# time). WORKERS=1 THREADS=2 runs them one after another on two threads.
WORKERS ?= 2
THREADS ?= 1
test: $(STAMP)
	OMP_NUM_THREADS=$(THREADS) $(BIN)/python -m pytest -n $(WORKERS) --dist loadfile

# Other CPUs, simulated on this one: the notebooks' outputs must replay unchanged under each
# set-up of scripts/portable.py (vector width, MKL's code path, thread count; `--list` says
# which run here). SETUPS="scalar avx2-t3" runs some; CI runs those two.
test-portable: $(STAMP)
	$(BIN)/python scripts/portable.py $(SETUPS)

# The wheel, installed with its [book] extra into a fresh venv, runs the training chapter from a
# copy of book/ outside the checkout (scripts/test_wheel.py; CHAPTERS="training lm" for more).
test-wheel: $(STAMP)
	$(BIN)/python scripts/test_wheel.py $(CHAPTERS)

# Debian's Chromium for the browser checks (Playwright's own browser download needs the network).
# A target of its own, so that .ci/run installs it once before the two checks run side by side.
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# Settings in pyproject.toml ([tool.ruff], [tool.mypy], [tool.pyright]) and book/ruff.toml (the
# notebooks' 76 columns). zizmor audits the workflow offline (no GitHub API).
LINTED := minitransformer tests benchmarks scripts book conftest.py
lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy minitransformer
	$(BIN)/pyright
	$(BIN)/actionlint .github/workflows/ci.yml
	$(BIN)/zizmor --offline --quiet .github/

check-html: $(STAMP) chromium
	@test -f _build/html/index.html || $(MAKE) book
	$(BIN)/python tests/html/check_html.py _build/html --screenshots _build/screenshots

# Every chapter, or some: make check-lab CHAPTERS="warmup attention". Two JupyterLabs at once
# (every other chapter to each): a chapter spends about half its time waiting on the browser.
LAB_JOBS ?= 2
check-lab: $(STAMP) chromium
	$(BIN)/python tests/lab/check_lab.py --jobs $(LAB_JOBS) --screenshots _build/lab-screenshots $(foreach c,$(CHAPTERS),--chapter $(c))

# Jupyter refuses to start as root unless told; containers and CI machines often run as root.
LAB_FLAGS := --ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	$(BIN)/jupyter lab $(LAB_FLAGS) book/

serve:
	@test -f _build/html/index.html || { echo "No built book: run 'make book' first."; exit 1; }
	@echo "Serving the book on http://127.0.0.1:$(PORT)/ (Ctrl-C stops)"
	$(PYTHON) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

notebooks: $(STAMP)
	$(BIN)/python scripts/run_notebooks.py $(NOTEBOOKS)

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf _build .pytest_cache .hypothesis
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info

# Prints the list at the top of this file; tests/test_packaging.py checks that it names every
# target, so the list cannot drift from the rules.
help:
	@sed -n 's/^#   make /make /p' $(firstword $(MAKEFILE_LIST))
