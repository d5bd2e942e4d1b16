# serverless-worker: the commands a developer and CI use.
# Needs only python3.13 (the Lambda runtime's version; scripts/lambda-python.sh finds it,
# pyenv's included), make, npm and java on the machine; everything else is installed into
# virtualenvs here (.venv for the project, .venv-sam for the SAM CLI, .venv-checkov).

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules --no-print-directory

# The interpreter of the Lambda runtime's version (python3.13) for the venvs and the build.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell scripts/lambda-python.sh)
endif
export PYTHON
# x86_64 or arm64: the wheels `make sam-build` installs (the stack's Architecture parameter).
ARCHITECTURE ?= x86_64
export ARCHITECTURE
VENV ?= .venv
SAM_VENV ?= .venv-sam
# aws-sam-cli pins boto3 to one exact version, so it gets a venv of its own.
SAM_CLI_VERSION ?= 1.170.0
# The IAM policy scanner, in a venv of its own too (its pins clash with both others).
CHECKOV_VENV ?= .venv-checkov
CHECKOV_VERSION ?= 3.3.30
AWS_REGION ?= us-east-1
# Extra pytest arguments, e.g. make test PYTEST_ARGS="tests/cli -x"
PYTEST_ARGS ?=
# Extra arguments for the main command, e.g. make run RUN_ARGS=--help
RUN_ARGS ?=
# Extra benchmark arguments, e.g. make bench BENCH_ARGS=--quick
BENCH_ARGS ?=

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_PROGRESS_BAR := off
export SAM_CLI_TELEMETRY := 0
export AWS_DEFAULT_REGION ?= $(AWS_REGION)

# Stamps are named after what they installed, so a changed pyproject.toml (or SAM CLI
# version) reinstalls and an unchanged one never does, whatever the file times say.
DEPS_KEY := $(shell sha256sum pyproject.toml 2>/dev/null | cut -c1-16)
VENV_STAMP := $(VENV)/.installed-$(DEPS_KEY)
SAM_STAMP := $(SAM_VENV)/.installed-aws-sam-cli-$(SAM_CLI_VERSION)
SAM := $(SAM_VENV)/bin/sam
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-checkov-$(CHECKOV_VERSION)
# SAM's expansion of template.yaml (policy templates become IAM statements), for the scan.
IAM_SCAN_CFN := .aws-sam/iam-scan/template.json

# $(call fresh_venv,DIR): (re)create DIR unless it is a working venv of $(PYTHON)'s exact
# version (a pyenv patch upgrade leaves old venvs pointing at a missing interpreter).
define fresh_venv
	@test -n "$(PYTHON)" || exit 2  # scripts/lambda-python.sh has said why
	@if [ "$$($(1)/bin/python -V 2>&1)" != "$$($(PYTHON) -V 2>&1)" ]; then \
		echo "creating $(1) with $$($(PYTHON) -V 2>&1)"; \
		rm -rf "$(1)"; \
		$(PYTHON) -m venv "$(1)"; \
	fi
	@rm -f $(1)/.installed-*
endef

.PHONY: help venv sam-venv checkov-venv test test-deployed run bench lint ruff mypy dist sam-validate sam-build sam-local-invoke iam-scan iam-proof clean distclean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

venv: $(VENV_STAMP) ## create or refresh .venv (the package, editable, with the dev extras)

$(VENV_STAMP):
	$(call fresh_venv,$(VENV))
	@echo "installing serverless-worker and its development tools into $(VENV) (once; about a minute)"
	$(VENV)/bin/python -m pip install -qq -e ".[dev]"
	@touch "$@"

sam-venv: $(SAM_STAMP) ## create or refresh .venv-sam (the SAM CLI)

$(SAM_STAMP):
	$(call fresh_venv,$(SAM_VENV))
	$(SAM_VENV)/bin/python -m pip install -qq "aws-sam-cli==$(SAM_CLI_VERSION)"
	@touch "$@"

checkov-venv: $(CHECKOV_STAMP) ## create or refresh .venv-checkov (checkov, the IAM policy scanner)

$(CHECKOV_STAMP):
	$(call fresh_venv,$(CHECKOV_VENV))
	$(CHECKOV_VENV)/bin/python -m pip install -qq "checkov==$(CHECKOV_VERSION)"
	@touch "$@"

# pytest's exit 5 ("no tests ran") is non-zero, so it fails this target too. Every test
# server listens on a port the OS picks, so xdist workers never collide.
test: venv ## run every test tier in parallel (installs DynamoDB Local first when the project has it)
	@if [ -f scripts/install-dynamodb-local.sh ]; then bash scripts/install-dynamodb-local.sh; fi
	$(VENV)/bin/python -m pytest -n auto --durations=10 $(PYTEST_ARGS)

# The deployed tier (tests/deployed, which `make test` never collects): sam build, the three
# sandboxes on loopback, a plain `sam deploy` of template.yaml per protocol into LocalStack,
# every protocol worked on the stack's own schedule, the long-running path, the failure paths,
# a log scan for secrets and `sam delete`; beside them, the project `serverless-worker init`
# writes, built and deployed as its README says, works its jobs on its own schedule. It ends
# with the `deployed tier:` and `init stack:` lines. LocalStack is AWS_ENDPOINT_URL when set
# (one already running); else, where Docker answers, LocalStack's own CLI (`localstack start`);
# else the host helper beside this repository (../shared/tools/localstack-host.sh, or
# LOCALSTACK_HOST=PATH), started and stopped by the run. About 10 minutes.
DEPLOYED_SUMMARY := .aws-sam/deployed/summary.txt
test-deployed: tools-test-deployed venv sam-venv ## sam deploy the stack into LocalStack and run every protocol through it
	@rm -f $(DEPLOYED_SUMMARY)
	@status=0; SWTEST_DEPLOYED_TIER=1 $(call helper_env,SWTEST_LOCALSTACK_HOST,LOCALSTACK_HOST) $(VENV)/bin/python -m pytest \
		tests/deployed -p no:cacheprovider -p no:xdist --timeout 1500 -v $(PYTEST_ARGS) || status=$$?; \
	if [ -f $(DEPLOYED_SUMMARY) ]; then cat $(DEPLOYED_SUMMARY); else echo "deployed tier: FAILED before any stack was deployed"; fi; \
	exit $$status

# The main command: the demo, locally, on embedded defaults (built-in sandboxes, a
# temporary SQLite state file, moto's Step Functions for the long-running examples),
# ending with a summary once idle.
run: venv ## run the demo worker locally against the built-in sandboxes
	$(VENV)/bin/serverless-worker local $(RUN_ARGS)

# Throughput, calls and DynamoDB requests per job, cold start, latency, cost, dispatch rate and
# DynamoDB write units per job against the 6-unit target,
# in one run (under ten minutes; BENCH_ARGS=--quick: about two). Table on stdout, JSON in
# bench-results/bench.json. Run it on an otherwise idle machine: it measures CPU-bound code.
bench: venv ## benchmarks: throughput, calls/job, cold start, latency, cost (BENCH_ARGS=--quick)
	$(VENV)/bin/python -m benchmarks.run $(BENCH_ARGS)

# 10,000 jobs per protocol through the local runtime at concurrency 32 against sandboxes with 5%
# random faults; reports jobs lost (exit 1 unless 0), outcomes, re-runs, duplicates, jobs/s and
# RSS. JSON in bench-results/soak.json. Not a test: tens of minutes. SOAK_ARGS="--jobs 1000 --protocol priostack"
SOAK_ARGS ?=
.PHONY: soak
soak: venv ## soak: 10,000 jobs per protocol, 5% faults, jobs lost must be 0 (SOAK_ARGS=...)
	$(VENV)/bin/python scripts/soak.py $(SOAK_ARGS)

lint: ruff mypy ## ruff and mypy

ruff: venv ## ruff on everything
	$(VENV)/bin/ruff check .

mypy: venv ## mypy on the package
	$(VENV)/bin/mypy

# The project `serverless-worker init` writes is validated and built too: its layer installs
# serverless-worker from the wheel init puts in its vendor/ (the rest of the layer from PyPI).
sam-validate: venv sam-venv ## sam validate --lint on template.yaml and on the project `serverless-worker init` writes (and sam build of it); check_versions.py
	$(SAM) validate --lint --region $(AWS_REGION)
	$(SAM_VENV)/bin/python scripts/check_versions.py template.yaml
	@project=$$(mktemp -d)/my-worker; trap 'rm -rf "$$(dirname "$$project")"' EXIT; \
		$(VENV)/bin/serverless-worker init "$$project" >/dev/null; \
		echo "sam validate --lint on the template of serverless-worker init"; \
		cd "$$project" && $(CURDIR)/$(SAM) validate --lint --region $(AWS_REGION); \
		echo "sam build of the project of serverless-worker init"; \
		PATH="$(dir $(PYTHON)):$$PATH" $(CURDIR)/$(SAM) build >build.log 2>&1 || { cat build.log; exit 1; }; \
		test -f .aws-sam/build/RuntimeLayer/python/serverless_worker/__init__.py; \
		$(PYTHON) -I -c \
			"import sys; sys.path[:0] = ['.aws-sam/build/ExecutorFunction', '.aws-sam/build/RuntimeLayer/python']; \
			import app, handlers, serverless_worker as sw; \
			assert '/.aws-sam/build/RuntimeLayer/python/serverless_worker/' in sw.__file__, sw.__file__; \
			assert callable(app.executor) and callable(app.scheduler) and callable(app.drain); \
			print('ok: the built layer holds serverless_worker', sw.__version__, 'from vendor/; app and handlers import on it')"

# The release: sdist and wheel in dist/, `twine check --strict` on both, then the wheel
# installed into a fresh venv (its dependencies from PyPI), imported, and its command run.
# Built without isolation (setuptools and wheel are dev dependencies), on a copy of the
# sources, so the tree gets no build/.
DIST ?= dist
dist: venv ## build the sdist and wheel into dist/, twine check them, install the wheel in a fresh venv and run it
	@rm -rf $(DIST); scratch=$$(mktemp -d); trap 'rm -rf "$$scratch"' EXIT; \
		git ls-files -z pyproject.toml README.md CHANGELOG.md layers/runtime/serverless_worker \
			| xargs -0 cp --parents -t "$$scratch"; \
		$(VENV)/bin/python -m build --no-isolation --sdist --wheel --outdir "$(CURDIR)/$(DIST)" "$$scratch" >"$$scratch/build.log" 2>&1 \
			|| { cat "$$scratch/build.log"; exit 1; }; \
		$(VENV)/bin/twine check --strict $(DIST)/*; \
		echo "installing $$(cd $(DIST) && ls *.whl) into a fresh venv"; \
		$(PYTHON) -m venv "$$scratch/venv"; \
		"$$scratch/venv/bin/python" -m pip install -qq $(DIST)/*.whl; \
		cd "$$scratch" && ./venv/bin/python -c "import serverless_worker, sys; print('import serverless_worker', serverless_worker.__version__)"; \
		./venv/bin/serverless-worker --help >/dev/null && echo "serverless-worker --help: ok"; \
		ls -1 "$(CURDIR)/$(DIST)"

sam-build: sam-venv ## sam build for ARCHITECTURE (x86_64 or arm64) with python3.13, then check the bytecode
	$(SAM) build --parameter-overrides Architecture=$(ARCHITECTURE)
	$(PYTHON) scripts/check_bytecode.py --architecture $(ARCHITECTURE) .aws-sam/build

# sam build, then `sam local invoke` of every function with each of its events/ files in a
# Lambda container, checking the outcome (scripts/sam_local_invoke.py says what); then the
# same for the executor and scheduler of the project `serverless-worker init` writes. On Docker
# where it answers (as SAM documents it); else podman through the host helper beside this
# repository (../shared/tools/sam-local-podman.sh, or SAM_LOCAL_PODMAN=PATH; SAM_LOCAL_PODMAN=
# empty insists on Docker).
sam-local-invoke: tools-sam-local-invoke venv sam-venv ## sam build + sam local invoke every function with its events, and the init project's (container)
	$(call helper_env,SAM_LOCAL_PODMAN,SAM_LOCAL_PODMAN) $(VENV)/bin/python scripts/sam_local_invoke.py \
		--sam $(SAM) --sam-python $(SAM_VENV)/bin/python

# The container tools a target uses (scripts/container_tools.py): the user's Docker first, the
# host helper beside this repository second. With neither, the target stops before installing
# anything, with one line naming what to install. $(call helper_env,ENV,VAR): ENV="$(VAR)" when
# VAR was given at all (empty counts: SAM_LOCAL_PODMAN= means Docker), else nothing.
helper_env = $(if $(filter undefined,$(origin $(2))),,$(1)="$($(2))")
helper_arg = $(if $(filter undefined,$(origin $(1))),,--helper "$($(1))")
.PHONY: tools-sam-local-invoke tools-test-deployed
tools-sam-local-invoke:
	$(eval _missing := $(shell $(PYTHON) scripts/container_tools.py check sam-local-invoke $(call helper_arg,SAM_LOCAL_PODMAN) 2>&1))
	$(if $(_missing),$(error $(_missing)))
	@:
tools-test-deployed:
	$(eval _missing := $(shell $(PYTHON) scripts/container_tools.py check test-deployed $(call helper_arg,LOCALSTACK_HOST) 2>&1))
	$(if $(_missing),$(error $(_missing)))
	@:

# checkov on template.yaml itself and on its SAM expansion: the IAM statements SAM generates
# (policy templates, tracing, destinations) exist only in the latter. scripts/checkov adds
# CKV_SW_1: no wildcard action, and Resource "*" only where AWS has no narrower resource.
# Suppressions live in template.yaml as Metadata checkov skips, each with its reason.
# --skip-download keeps it offline (no Prisma Cloud guideline lookups).
iam-scan: sam-venv checkov-venv ## scan template.yaml's IAM and resources with checkov (least privilege)
	$(SAM_VENV)/bin/python scripts/sam_to_cfn.py template.yaml $(IAM_SCAN_CFN)
	$(CHECKOV_VENV)/bin/checkov --quiet --compact --skip-download --framework cloudformation \
		--external-checks-dir scripts/checkov -f template.yaml -f $(IAM_SCAN_CFN)

# Least privilege proven by running it: every AWS API call each function made during
# `make test-deployed` (which records them, RecordAwsCalls=true), evaluated against that
# function's role in the built template with @cloud-copilot/iam-simulate (scripts/iam_proof/,
# pinned by its package-lock.json; `npm ci` on first use). Prints `iam: N calls by M functions,
# 0 denied, K grants never used`; exits 1 on a denial. No LocalStack: it reads the record.
IAM_PROOF_RECORD := .aws-sam/deployed/aws-calls.json
iam-proof: sam-venv ## evaluate every AWS call the deployed tier's functions made against their roles (after test-deployed)
	$(SAM_VENV)/bin/python scripts/iam_proof.py $(IAM_PROOF_RECORD) $(IAM_PROOF_ARGS)

clean: ## remove build output and caches (keeps the venvs)
	rm -rf .aws-sam .pytest_cache .mypy_cache .ruff_cache layers/runtime/*.egg-info $(DIST)
	find . -path ./$(VENV) -prune -o -path ./$(SAM_VENV) -prune -o -path ./$(CHECKOV_VENV) -prune \
		-o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean ## clean, and remove the venvs
	rm -rf $(VENV) $(SAM_VENV) $(CHECKOV_VENV)
