# minitransformer: every command a reader or maintainer needs (`make help` prints this list;
# one line per target). See README.md.
#   make install     create .venv/ with the pinned requirements (the targets below do it if needed)
#   make book        build the HTML book into _build/html/ (installs first if needed)
#   make test        run the unit tests and every notebook under nbval (installs first if needed)
#   make check-html  check every page of the built book in headless Chromium (builds it if missing)
#   make lab         JupyterLab on book/
#   make serve       serve _build/html on http://127.0.0.1:8000
#   make notebooks   re-execute the notebooks in place (one: NOTEBOOKS=book/NAME.ipynb)
#   make bench       run the benchmarks in benchmarks/
#   make clean       remove build outputs (keeps .venv/)
#   make distclean   remove build outputs and .venv/
#   make help        list these commands

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PORT   ?= 8000
# Notebooks in reading order, from _toc.yml.
NOTEBOOKS = $(shell sed -n 's/^ *- file: *\(book\/[^ ]*\)/\1/p' _toc.yml | while read f; do [ -f $$f.ipynb ] && echo $$f.ipynb; done)

.PHONY: install book test check-html lab serve notebooks bench clean distclean help

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install -r requirements.txt
	touch $(STAMP)

book: $(STAMP)
	rm -rf _build/html _build/jupyter_execute
	$(BIN)/jupyter-book build . --builder html -W -n --keep-going
	@echo
	@echo "The book is at $(CURDIR)/_build/html/index.html"

test: $(STAMP)
	$(BIN)/python -m pytest

check-html: $(STAMP)
	@test -f _build/html/index.html || $(MAKE) book
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	$(BIN)/python tests/html/check_html.py _build/html --screenshots _build/screenshots

# Jupyter refuses to start as root unless told; containers and CI machines often run as root.
LAB_FLAGS := --ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	$(BIN)/jupyter lab $(LAB_FLAGS) book/

serve:
	@test -f _build/html/index.html || { echo "No built book: run 'make book' first."; exit 1; }
	@echo "Serving the book on http://127.0.0.1:$(PORT)/ (Ctrl-C stops)"
	$(PYTHON) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

notebooks: $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.kernel_name=python3 \
	  --ExecutePreprocessor.record_timing=False $(NOTEBOOKS)

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
