# The two commands a newcomer needs: `make run` and `make test` (see README.md).
.PHONY: run test test-reference serve-inference lint cluster

HOST ?= 127.0.0.1
PORT ?= 8000

run:
	@scripts/install-system.sh
	@scripts/install-python.sh
	@scripts/run.sh $(HOST) $(PORT)

test:
	@scripts/install-system.sh test
	@scripts/install-python.sh test
	@scripts/test.sh

# The live NVIDIA/personaplex reference runs, beside the stored reference data `make test` checks: needs a checkout
# of NVIDIA/personaplex at 3428dfd in PARLEY_PERSONAPLEX_SRC (README, "Live reference runs").
test-reference:
	@scripts/install-personaplex-ref.sh --check-source
	@scripts/install-system.sh test
	@scripts/install-python.sh test
	@scripts/test-reference.sh

# The production topology on loopback (PostgreSQL, Redis, 2 inference services, 2 daphne behind nginx,
# Celery worker + beat) until Ctrl-C; docs/deploy.md.
cluster:
	@scripts/install-system.sh test
	@scripts/install-python.sh
	@.venv/bin/python scripts/cluster.py

lint:
	.venv/bin/ruff check inference webapp tests bench
	.venv/bin/lint-imports --no-cache
