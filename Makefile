# The commands the README promises. `make test` is what CI runs (.ci/run).

CARGO ?= cargo

.PHONY: build run test bench chaos lint fmt openapi helm-check fuzz-api

build: ## build every crate of the workspace (debug)
	$(CARGO) build --workspace

run: ## shopfloor serve on the embedded PostgreSQL under .shopfloor/ (or on DATABASE_URL)
	$(CARGO) run --release --bin shopfloor -- serve

test: ## every test, against a throwaway PostgreSQL unless DATABASE_URL is set
	scripts/test.sh

bench: ## measure the engine against this machine's durable-commit limit; appends to bench/history.md
	scripts/bench.sh

chaos: ## 2000 runs over HTTP through process kills, a PostgreSQL crash, a PgBouncer restart, cut and blackholed links, a frozen engine and a poisoned run
	scripts/chaos.sh

lint: ## rustfmt's layout (rustfmt.toml) and clippy over every target, warnings as errors
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## format the workspace (rustfmt.toml)
	$(CARGO) fmt --all

openapi: ## regenerate openapi/openapi.json from the code (the drift test checks it)
	SHOPFLOOR_OPENAPI_WRITE=1 $(CARGO) test -p shopfloor-api --test it -- openapi::the_committed_document_is_the_generated_one

helm-check: ## render the Helm chart and validate it strictly against the Kubernetes schemas (installs helm and kubernetes-validate under target/tools when missing)
	scripts/helm-check.sh

fuzz-api: ## schemathesis (installed from PyPI under target/fuzz) against a real shopfloor serve, as an owner and as a host; fails on any failed check (FUZZ_MAX_TIME seconds a pass, 120)
	scripts/fuzz-api.sh
