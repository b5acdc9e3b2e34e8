// Package deploy holds nftproxy's Kubernetes manifests (DaemonSet, RBAC, ConfigMap,
// kustomization), the same objects as a Helm chart (helm/nftproxy), and its
// Dockerfile. Manifests embeds the kustomize manifests for the tests that check them
// offline and apply them to a real API server (e2e/apiserver).
package deploy

import "embed"

// Manifests holds every *.yaml file of this directory: kustomization.yaml and the
// resources it lists.
//
//go:embed *.yaml
var Manifests embed.FS
