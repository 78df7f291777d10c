# The two Quick start commands. Each creates .venv and installs everything
# (torch pinned to the 2.13.0 CPU build through the dev extra) on first use.
VENV ?= .venv
STAMP := $(VENV)/.installed-dev

.PHONY: demo check unit bench sshd

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tuiwatch demo

# The suite on a worker per CPU, four at most: most tests wait on a real training
# process, and four workers on two cores passed as two did (docs/architecture.md).
PARALLEL := -n logical --maxprocesses=4 --dist worksteal

check: $(STAMP) sshd
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/pytest $(PARALLEL)

bench: $(STAMP)
	$(VENV)/bin/python bench/overhead.py

# The SSH tests run a real sshd on 127.0.0.1. Where it is missing and this is
# root with apt (CI), install it; elsewhere those tests say they were skipped.
sshd:
	@if [ ! -x /usr/sbin/sshd ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing openssh-server for the SSH tests"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q openssh-server >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null 2>&1 && apt-get install -y -q openssh-server >/dev/null 2>&1; } || \
		echo "could not install openssh-server: the SSH tests will be skipped"; \
	fi

# The suite without the real-process integration tests (the fast inner loop; CI runs `check`).
unit: $(STAMP)
	$(VENV)/bin/pytest $(PARALLEL) -m "not integration"
