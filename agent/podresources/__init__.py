"""The kubelet's PodResources v1 API (package `v1`, service `PodResourcesLister`): the kubelet's own api.proto
(k8s.io/kubelet pkg/apis/podresources/v1) and code generated from it; regenerate with `scripts/gen_podresources.sh`."""
