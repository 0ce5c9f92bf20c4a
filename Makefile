# The commands the README promises. `make test` is what CI runs (.ci/run).

CARGO ?= cargo

.PHONY: build run test bench chaos lint fmt openapi

build: ## build every crate of the workspace (debug)
	$(CARGO) build --workspace

run: ## shopfloor serve on the embedded PostgreSQL under .shopfloor/ (or on DATABASE_URL)
	$(CARGO) run --release --bin shopfloor -- serve

test: ## every test, against a throwaway PostgreSQL unless DATABASE_URL is set
	scripts/test.sh

bench: ## the benchmark harness
	@echo "make bench: not built yet" >&2; exit 1

chaos: ## the fault-injection runs
	@echo "make chaos: not built yet" >&2; exit 1

lint: ## clippy over every target, warnings as errors
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## format the workspace
	$(CARGO) fmt --all

openapi: ## regenerate openapi/openapi.json
	@echo "make openapi: not built yet" >&2; exit 1
