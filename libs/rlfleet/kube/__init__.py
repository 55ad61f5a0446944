"""Kubernetes side of rlfleet: `rlfleet scale rollout` (scale.py) and offline validation
of rendered chart manifests (manifests.py). Both need the `kubernetes` /
`kubernetes-validate` packages, imported only when used."""
