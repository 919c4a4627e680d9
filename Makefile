# The course's verbs. Each is one line over a real tool; all of them set up .venv first if needed.
#   make book      build the HTML book into _build/html, every chapter executed (warnings are errors), and its
#                  Chinese edition into _build/html/zh from the same sources and locales/zh_CN
#   make locales   update the translation catalogues locales/zh_CN from the English pages and exercises:
#                  new messages empty, changed ones fuzzy, for a translator (tests/test_translation.py)
#   make test      run every test (reference, checks, nbgrader round trip, grader, chapters, book build)
#   make release   regenerate the student notebooks in exercises/ from solutions/ (nbgrader); one of them:
#                  make release ASSIGNMENT=ex02_scaled_dot_product (several: ASSIGNMENT="ex02_... ex03_...")
#   make new-exercise NAME=ex12_sliding_window [TITLE="Sliding-window masks"] [TOPIC=sliding_window]
#                  a new exercise that works from the start: its reference, checks, bank, registry entry and
#                  source notebook, around an example to replace (instructors/authoring.md)
#   make grade     grade a folder of submissions: make grade ASSIGNMENT=ex02_scaled_dot_product SUBMISSIONS=submitted
#   make lint      ruff check and format check
#   make notebooks regenerate the chapters' notebooks chapters/*.ipynb (for Colab and Binder) from the .md,
#                  their MyST markup (citations, cross-references, directives) in plain Markdown
#   make chromium  install Debian's chromium for the browser tests, if missing (needs root and apt-get)
#   make postgresql install Debian's PostgreSQL server for the gradebook tests, if missing (root and apt-get)
#   make student-release DEST=dir   a copy of the course for learners: no solutions, banks or hidden tests

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
# The default set-up installs the CPU build of torch 2.13; a torch already in the venv (say a CUDA build
# you installed first) is kept. Elsewhere than on PyPI mirrors that serve the CPU build, set
# TORCH_INDEX=https://download.pytorch.org/whl/cpu.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
ASSIGNMENT ?= ex02_scaled_dot_product
SUBMISSIONS ?= submitted

.PHONY: book locales test release new-exercise grade lint clean notebooks chromium postgresql student-release

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	# uv installs the rest in about 20 s where pip takes about 3 minutes (the same packages, from PyPI); where
	# uv cannot be installed or cannot reach an index that pip is configured for, pip does it
	{ $(BIN)/pip install --quiet uv && $(BIN)/uv pip install --python $(BIN)/python --compile-bytecode -e ".[dev]"; } \
	  || $(BIN)/pip install -e ".[dev]"
	touch $@

book: $(VENV)/.installed
	$(BIN)/python _ext/build_book.py
	@echo "The book is in _build/html (open _build/html/index.html), its Chinese edition in _build/html/zh."

locales: $(VENV)/.installed
	PATH="$(BIN):$$PATH" $(BIN)/python _ext/build_book.py --gettext

# one test worker more than the cores: the book's worker spends much of its time waiting on the processes it
# started (the chapters' kernels, the browser), and on a busy machine more processes get more of the cores
test: $(VENV)/.installed chromium postgresql
	$(BIN)/python -m pytest -n $$($(BIN)/python -c 'import os; print(len(os.sched_getaffinity(0)) + 1)') \
		--dist loadgroup --durations=40

# ASSIGNMENT's default is for `make grade`: `make release` releases one assignment only when it is given
release: $(VENV)/.installed
	PATH="$(BIN):$$PATH" $(BIN)/attention-release $(if $(filter command line,$(origin ASSIGNMENT)),$(ASSIGNMENT))

new-exercise: $(VENV)/.installed
	@test -n "$(NAME)" || { echo 'usage: make new-exercise NAME=ex12_sliding_window [TITLE="Sliding-window masks"] [TOPIC=sliding_window]'; exit 2; }
	$(BIN)/python -m attention_course.grading.scaffold "$(NAME)" $(if $(TITLE),--title "$(TITLE)") $(if $(TOPIC),--topic "$(TOPIC)")

grade: $(VENV)/.installed
	$(BIN)/attention-grade $(ASSIGNMENT) $(SUBMISSIONS)

notebooks: $(VENV)/.installed
	$(BIN)/jupytext --update --to ipynb chapters/*.md
	$(BIN)/python _ext/plain_markdown.py chapters/*.ipynb

# Without root or apt-get the browser tests are skipped (they say why); a failed install stops here.
chromium:
	@if test -x /usr/bin/chromium; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else echo "chromium is missing and needs root and apt-get to install: the browser tests will be skipped"; fi

# The gradebook tests start and stop a PostgreSQL server of their own (Debian's binaries, a Unix socket in a
# temporary folder); without root or apt-get they are skipped, saying why.
postgresql:
	@if ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
	else echo "PostgreSQL is missing and needs root and apt-get to install: its gradebook tests will be skipped"; fi

student-release: $(VENV)/.installed
	@test -n "$(DEST)" || { echo "usage: make student-release DEST=folder"; exit 2; }
	$(BIN)/python -m attention_course.grading.student_release "$(DEST)"

lint: $(VENV)/.installed
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf _build grading-report .pytest_cache .ruff_cache .hypothesis
