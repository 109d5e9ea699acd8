# The two commands a newcomer needs: `make run` and `make test` (see README.md).
.PHONY: run test serve-inference lint

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

lint:
	.venv/bin/ruff check inference webapp tests bench
