"""The cluster DNS of `make cluster`: CoreDNS as kubeadm v1.37.2 deploys it (its phases/addons/dns manifests), so
that pods find Services by name as in a kubeadm cluster: the coredns ServiceAccount and the system:coredns
ClusterRole and binding (it watches Services, EndpointSlices, Pods and Namespaces), the Corefile in the coredns
ConfigMap, the kube-dns Service at the kubelets' clusterDNS address, and a Deployment of two replicas.

The image is kubeadm's name for it; the test registry serves it under that name (tests/kit/coredns.py), as every
image a cluster of a checkout pulls. The Corefile forwards what is not the cluster's to the upstream of the
CoreDNS pods' resolv.conf (dnsPolicy Default: the kubelet's resolvConf), which the cluster chooses
(cluster.py: an address where nothing answers, so no query leaves the machine).
"""
from __future__ import annotations

VERSION = "v1.14.6"  # kubeadm v1.37.2's constants.CoreDNSVersion; scripts/peers/coredns.sh builds it
IMAGE = f"registry.k8s.io/coredns/coredns:{VERSION}"
REPLICAS = 2  # kubeadm's coreDNSReplicas
NAMESPACE = "kube-system"
NAME = "coredns"
LABELS = {"k8s-app": "kube-dns"}
CONTROL_PLANE_TAINT = "node-role.kubernetes.io/control-plane"


def corefile(domain: str) -> str:
    """kubeadm's Corefile for the cluster domain `domain`."""
    return f""".:53 {{
    errors
    health {{
       lameduck 5s
    }}
    ready
    kubernetes {domain} in-addr.arpa ip6.arpa {{
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }}
    prometheus :9153
    forward . /etc/resolv.conf {{
       max_concurrent 1000
    }}
    cache 30 {{
       disable success {domain}
       disable denial {domain}
    }}
    loop
    reload
    loadbalance
}}
"""


def _port(name: str, port: int, protocol: str) -> dict:
    return {"name": name, "port": port, "protocol": protocol, "targetPort": port}


def manifests(dns_ip: str, domain: str, image: str = IMAGE, replicas: int = REPLICAS) -> list[dict]:
    """Every object kubeadm's CoreDNS add-on makes, in the order it makes them. kubeadm's Service carries
    resourceVersion "0" for its own updates of an existing one; these are only ever created."""
    rbac = "rbac.authorization.k8s.io/v1"
    cluster_role = {
        "apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
        "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                   "verbs": ["list", "watch"]},
                  {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]}
    binding = {
        "apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "system:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, "namespace": NAMESPACE},
                  "data": {"Corefile": corefile(domain)}}
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": NAMESPACE,
                     "labels": {**LABELS, "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"},
                     "annotations": {"prometheus.io/port": "9153", "prometheus.io/scrape": "true"}},
        "spec": {"clusterIP": dns_ip, "selector": LABELS,
                 "ports": [_port("dns", 53, "UDP"), _port("dns-tcp", 53, "TCP"), _port("metrics", 9153, "TCP")]}}
    container = {
        "name": NAME, "image": image, "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": {"memory": "170Mi"}, "requests": {"cpu": "100m", "memory": "70Mi"}},
        "args": ["-conf", "/etc/coredns/Corefile"],
        "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": True}],
        "ports": [{"containerPort": 53, "name": "dns", "protocol": "UDP"},
                  {"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"},
                  {"containerPort": 9153, "name": "metrics", "protocol": "TCP"},
                  {"containerPort": 8080, "name": "liveness-probe", "protocol": "TCP"},
                  {"containerPort": 8181, "name": "readiness-probe", "protocol": "TCP"}],
        "livenessProbe": {"httpGet": {"path": "/health", "port": "liveness-probe", "scheme": "HTTP"},
                          "initialDelaySeconds": 60, "timeoutSeconds": 5, "successThreshold": 1,
                          "failureThreshold": 5},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "readiness-probe", "scheme": "HTTP"}},
        "securityContext": {"allowPrivilegeEscalation": False,
                            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                            "readOnlyRootFilesystem": True}}
    affinity = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {
            "labelSelector": {"matchExpressions": [{"key": "k8s-app", "operator": "In", "values": ["kube-dns"]}]},
            "topologyKey": "kubernetes.io/hostname"}}]}}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": LABELS},
        "spec": {"replicas": replicas, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                 "selector": {"matchLabels": LABELS},
                 "template": {"metadata": {"labels": LABELS}, "spec": {
                     "priorityClassName": "system-cluster-critical", "serviceAccountName": NAME,
                     "affinity": affinity,
                     "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                                     {"key": CONTROL_PLANE_TAINT, "effect": "NoSchedule"}],
                     "nodeSelector": {"kubernetes.io/os": "linux"},
                     "containers": [container],
                     "dnsPolicy": "Default",
                     "volumes": [{"name": "config-volume", "configMap": {
                         "name": NAME, "items": [{"key": "Corefile", "path": "Corefile"}]}}]}}}}
    # kubeadm's order: the ConfigMap, the ClusterRole and its binding, the ServiceAccount, the Deployment, the Service
    return [config_map, cluster_role, binding, account, deployment, service]
