# rlfleet — every set-up step lives here or in scripts/; `make run` and `make test` work
# from a fresh clone.
SHELL := /bin/bash
PYTHON ?= .venv/bin/python
export RLFLEET_CACHE ?= $(HOME)/.cache/rlfleet

PROTOS := $(wildcard protos/rlfleet/v1/*.proto)
STUBS := $(patsubst protos/rlfleet/v1/%.proto,libs/rlfleet/v1/%_pb2.py,$(PROTOS))

.PHONY: help setup venv system proto vllm-venv run test test-quick bench results policy-bounds lint lock clean

help:
	@echo "make run           the main job on the local default (tiny model, CPU)"
	@echo "make run CONFIG=F  the same with another learner config (configs/local-tiny-9x9.yaml)"
	@echo "make run RECORD=N  ... and keep its figures as results/N.json"
	@echo "make results       regenerate docs/results.md and the README's table from results/"
	@echo "make test          the full test suite"
	@echo "make test-quick    unit and fast integration tests (no vLLM venv, no Kubernetes)"
	@echo "make bench         benchmarks (JSON + table under bench/results/)"
	@echo "make policy-bounds the solve rates of a perfect (BFS) and a random player, no model"
	@echo "make lint          ruff"
	@echo "make proto         regenerate the gRPC stubs"
	@echo "make lock          regenerate requirements.txt (the lock) from .venv"
	@echo "make images        build the images [PROFILE=hyperpod|local REGISTRY= TAG= PUSH=1]"
	@echo "make deploy        helm upgrade --install into the current kube context [VALUES=...]"
	@echo "make undeploy      helm uninstall"
	@echo "make chart-check   helm lint + offline validation of both profiles"
	@echo "make cluster-up    a single-node Kubernetes here, local images loaded (KUBECONFIG printed)"
	@echo "make cluster-down  stop it and put the host back (keeps /var/lib/rlfleet/shared; PURGE=1 removes it)"
	@echo "make apiserver-start / apiserver-stop   an API server alone (no nodes)"
	@echo "make clean         remove generated stubs"

venv: .venv/.rlfleet-stamp
.venv/.rlfleet-stamp: requirements.txt requirements-host.txt pyproject.toml scripts/setup_venv.sh
	@scripts/setup_venv.sh

system:
	@scripts/setup_system.sh

proto: $(STUBS)
$(STUBS) &: $(PROTOS) .venv/.rlfleet-stamp
	@mkdir -p libs/rlfleet/v1
	$(PYTHON) -m grpc_tools.protoc -Iprotos --python_out=libs --pyi_out=libs \
		--grpc_python_out=libs $(PROTOS)
	@touch $(STUBS)

setup: venv system proto

# vLLM (CPU build) in its own venv under $(RLFLEET_CACHE), built once per machine
vllm-venv: venv
	@scripts/setup_vllm_venv.sh >/dev/null

# CONFIG=configs/local-tiny-9x9.yaml runs another learner config (default: local-tiny.yaml);
# RECORD=NAME keeps its figures as results/NAME.json (docs/results.md is made from them)
run: setup
	$(PYTHON) -m rlfleet.local.run $(if $(CONFIG),--config $(CONFIG)) $(if $(RECORD),--record $(RECORD))

# The suite on one pytest-xdist worker more than there are cores: much of a test's time is
# spent waiting (services starting, heartbeats expiring, pods), and the extra worker fills
# it (README: 10-14% less wall clock on two machines). Tests that must share one worker say
# so with xdist_group marks (--dist loadgroup). TEST_WORKERS=1 runs it serially;
# RLFLEET_TEST_WAIT_SCALE=2 doubles every deadline on a busy machine (README).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: setup vllm-venv helm-tools apiserver
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The inner loop (docs/conventions.md, "Testing"): the unit tests and the integration
# modules listed here, less the tests marked slow, vllm, deploy or heavy; needs neither
# the vLLM venv nor the Kubernetes tools.
QUICK_MARKS := not slow and not vllm and not deploy and not heavy
QUICK_INTEGRATION := tests/integration/test_json_logs.py tests/integration/test_reward_api.py \
	tests/integration/test_rollout_capacity.py
test-quick: setup
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "$(QUICK_MARKS)" \
		tests/unit $(QUICK_INTEGRATION)

policy-bounds: setup
	$(PYTHON) -m rlfleet.local.policy_bounds

lock: venv
	@scripts/lock.sh

lint: venv
	$(PYTHON) -m ruff check libs services tests bench

bench: setup
	$(PYTHON) -m bench $(if $(RECORD),--record $(RECORD)) $(BENCHES)

results: venv
	$(PYTHON) -m rlfleet.local.records

clean:
	rm -rf libs/rlfleet/v1/*_pb2*.py libs/rlfleet/v1/*_pb2*.pyi .pytest_cache

-include mk/*.mk
