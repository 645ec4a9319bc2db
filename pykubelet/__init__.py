"""pykubelet: a kubelet in Python for a stock kube-apiserver and any CRI runtime."""

# the Kubernetes API level it implements: the Node's status.nodeInfo.kubeletVersion (`kubectl get nodes -o
# wide`) and `pykubelet --version`, which kubeadm's preflight parses
KUBELET_VERSION = "v1.37.0+pykubelet"
