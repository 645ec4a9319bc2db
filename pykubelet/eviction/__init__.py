"""Node-pressure and local-storage eviction, as the kubelet's pkg/kubelet/eviction: policy.py decides
(pure functions of what was measured), manager.py measures and acts."""
