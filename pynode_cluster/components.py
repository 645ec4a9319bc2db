"""The stock Kubernetes binaries (built from their Go modules by scripts/peers/kubernetes.sh) and the command
lines they run with here, kubeadm's choices where they matter, so the cluster's components and the test kit's
behave as in a kubeadm cluster: the Node and RBAC authorizers, NodeRestriction, service-account tokens signed
by a key pair of our own, node pod CIDRs allocated by the controller manager.

Every path and address is a parameter: one control plane per machine for `make cluster`, one per test module
for the e2e tests, one per VM for the lab.
"""
from __future__ import annotations

import base64
import os
from pathlib import Path

import requests

PEERS_BIN = Path(os.environ.get("PEERS_BIN", Path.home() / ".cache/pynode/bin"))  # scripts/peers/*.sh build into it
PEERS = PEERS_BIN / "kubernetes"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service: the apiserver's cert must name it
DNS_IP = "10.96.0.10"  # the kube-dns Service and the kubelets' clusterDNS: kubeadm's, the tenth of SERVICE_CIDR
CLUSTER_DOMAIN = "cluster.local"
CLUSTER_CIDR = "10.244.0.0/16"  # pod CIDRs of the nodes, a /24 each
ISSUER = "https://kubernetes.default.svc"
APISERVER_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local")
METRICS_SERVER_USER = "system:metrics-server"
METRICS_SERVER_PORT = 4443
# the aggregator verifies an extension API server's cert by its Service's name, SERVICE.NAMESPACE.svc
METRICS_SERVER_NAMES = ("metrics-server.kube-system.svc",)

# What kubeadm adds to the API server's bootstrap RBAC that matters here: its admins' group is cluster-admin
# (admin.kubeconfig and the apiserver's kubelet client are in it), and kube-proxy's service account is a
# node-proxier (the bootstrap binding covers the user system:kube-proxy, which our kube-proxy is).
# The node ClusterRoleBinding kubeadm once made is not needed with the Node authorizer.
KUBEADM_RBAC: list[dict] = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
     "metadata": {"name": "kubeadm:cluster-admins"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "kubeadm:cluster-admins"}]},
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kube-proxy", "namespace": "kube-system"}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
     "metadata": {"name": "kubeadm:node-proxier"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier"},
     "subjects": [{"kind": "ServiceAccount", "name": "kube-proxy", "namespace": "kube-system"}]},
]

# Every registry whose name the test images, critest or a runtime's defaults (containerd's sandbox image) use
MIRRORED_REGISTRIES = ("registry.k8s.io", "k8s.gcr.io", "gcr.io", "docker.io", "registry-1.docker.io", "quay.io")


def mirror_hosts(mirror: str, registries: tuple[str, ...] = MIRRORED_REGISTRIES) -> dict[str, str]:
    """containerd's certs.d layout (also read by pyruntime's image store), as relative path -> text, sending each
    registry to the plain HTTP mirror at host:port `mirror`, for pull and resolve; `_default` covers any other
    name. The mirror is also each one's `server`, the upstream a client falls back to when the mirror lacks an
    image: a node without network (a test's, the lab's VMs) never reaches out, not even for a DNS lookup."""
    text = (f'server = "http://{mirror}"\n\n[host."http://{mirror}"]\n'
            f'  capabilities = ["pull", "resolve"]\n  skip_verify = true\n')
    return {f"{name}/hosts.toml": text for name in (*registries, "_default")}


def apiserver_ready(server: str, ca: Path, client: Path) -> bool:
    """Whether the apiserver at `server` answers /readyz 200 to the client pair CLIENT.crt, CLIENT.key."""
    try:
        return requests.get(f"{server}/readyz", timeout=2, verify=str(ca),
                            cert=(f"{client}.crt", f"{client}.key")).status_code == 200
    except requests.RequestException:
        return False


def peer(name: str) -> str:
    path = PEERS / name
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is missing: run `make setup` (scripts/peers/*.sh build it)")
    return str(path)


def etcd_argv(data_dir: Path, client_port: int, peer_port: int, address: str = "127.0.0.1") -> list[str]:
    """etcd without TLS on `address` (loopback: only the apiserver beside it talks to it)."""
    client, peer_url = f"http://{address}:{client_port}", f"http://{address}:{peer_port}"
    return [peer("etcd"), "--name", "pynode", "--data-dir", str(data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"pynode={peer_url}", "--unsafe-no-fsync", "--log-level", "warn"]


def apiserver_argv(*, etcd: str, address: str, port: int, pki: Path, service_cidr: str = SERVICE_CIDR,
                   endpoint_reconciler: bool = True, front_proxy: Path | None = None) -> list[str]:
    """kube-apiserver with the certificates of `pki` (pki.ControlPlanePki's names). Without the endpoint
    reconciler (a loopback address, which it refuses) the `kubernetes` Service has no endpoints.

    With `front_proxy` (pki.front_proxy's directory) the aggregator proxies to extension API servers as
    kubeadm's does, with the front-proxy client cert and the user in X-Remote-* headers; it sends to the
    endpoints of their Services, not to the Service IP: no kube-proxy runs beside the control plane."""
    argv = [
        peer("kube-apiserver"),
        "--etcd-servers", etcd,
        "--bind-address", address, "--secure-port", str(port), "--advertise-address", address,
        "--service-cluster-ip-range", service_cidr,
        "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
        "--client-ca-file", str(pki / "ca.crt"),
        "--kubelet-client-certificate", str(pki / "apiserver-kubelet-client.crt"),
        "--kubelet-client-key", str(pki / "apiserver-kubelet-client.key"),
        "--kubelet-certificate-authority", str(pki / "ca.crt"),
        "--kubelet-preferred-address-types", "InternalIP,Hostname",
        "--authorization-mode", "Node,RBAC",
        "--enable-admission-plugins", "NodeRestriction",
        "--service-account-issuer", ISSUER,
        "--service-account-key-file", str(pki / "sa.pub"),
        "--service-account-signing-key-file", str(pki / "sa.key"),
        "--allow-privileged=true",
        "--profiling=false",
    ]
    if not endpoint_reconciler:
        argv += ["--endpoint-reconciler-type", "none"]
    if front_proxy is not None:
        argv += ["--requestheader-client-ca-file", str(front_proxy / "ca.crt"),
                 "--requestheader-allowed-names", "front-proxy-client",
                 "--requestheader-username-headers", "X-Remote-User",
                 "--requestheader-group-headers", "X-Remote-Group",
                 "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
                 "--proxy-client-cert-file", str(front_proxy / "front-proxy-client.crt"),
                 "--proxy-client-key-file", str(front_proxy / "front-proxy-client.key"),
                 "--enable-aggregator-routing=true"]
    return argv


def controller_manager_argv(*, kubeconfig: Path, pki: Path, cluster_cidr: str = CLUSTER_CIDR,
                            service_cidr: str = SERVICE_CIDR, allocate_node_cidrs: bool = True) -> list[str]:
    """kubeadm's kube-controller-manager: node CIDR allocation (unless whoever runs it gives the Nodes their
    CIDRs), a token per controller, the root CA in every namespace (kube-root-ca.crt, which kube-api-access
    volumes project) and the CSR signer."""
    return [peer("kube-controller-manager"), "--kubeconfig", str(kubeconfig),
            "--authentication-kubeconfig", str(kubeconfig), "--authorization-kubeconfig", str(kubeconfig),
            "--bind-address", "127.0.0.1", "--leader-elect=false",
            f"--allocate-node-cidrs={str(allocate_node_cidrs).lower()}", "--cluster-cidr", cluster_cidr,
            "--node-cidr-mask-size", "24",
            "--service-cluster-ip-range", service_cidr,
            "--use-service-account-credentials", "--root-ca-file", str(pki / "ca.crt"),
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--cluster-signing-cert-file", str(pki / "ca.crt"), "--cluster-signing-key-file", str(pki / "ca.key"),
            "--controllers", "*,bootstrapsigner,tokencleaner", "--profiling=false"]


def scheduler_argv(*, kubeconfig: Path) -> list[str]:
    return [peer("kube-scheduler"), "--kubeconfig", str(kubeconfig),
            "--authentication-kubeconfig", str(kubeconfig), "--authorization-kubeconfig", str(kubeconfig),
            "--bind-address", "127.0.0.1", "--leader-elect=false", "--profiling=false"]


def kube_proxy_argv(*, kubeconfig: Path, node: str, cluster_cidr: str = CLUSTER_CIDR) -> list[str]:
    """kube-proxy in iptables mode; it cannot size the global conntrack table from a node's network namespace,
    so it leaves it alone (--conntrack-max-per-core 0)."""
    return [peer("kube-proxy"), "--kubeconfig", str(kubeconfig), "--proxy-mode", "iptables",
            "--hostname-override", node, "--cluster-cidr", cluster_cidr, "--conntrack-max-per-core", "0",
            "--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256"]


def metrics_server_argv(*, kubeconfig: Path, address: str, pki: Path) -> list[str]:
    """metrics-server on `address` with its serving cert (pki.metrics_server_serving), scraping the
    kubelets' /metrics/resource at their InternalIP and the port their Node reports, verified by the cluster
    CA that issued their serving certs."""
    return [peer("metrics-server"), "--kubeconfig", str(kubeconfig),
            "--authentication-kubeconfig", str(kubeconfig), "--authorization-kubeconfig", str(kubeconfig),
            "--bind-address", address, "--secure-port", str(METRICS_SERVER_PORT),
            "--tls-cert-file", str(pki / "metrics-server-serving.crt"),
            "--tls-private-key-file", str(pki / "metrics-server-serving.key"),
            "--kubelet-certificate-authority", str(pki / "ca.crt"),
            "--kubelet-preferred-address-types", "InternalIP", "--kubelet-use-node-status-port",
            "--metric-resolution", "15s", "--profiling=false"]


def metrics_server_objects(address: str, ca_bundle: bytes) -> list[dict]:
    """What upstream's manifest gives metrics-server in the API, for one running outside the cluster at
    `address`: its rights (to read the kubelets' metrics, to delegate authentication and authorization, to
    read the front-proxy CA the API server publishes), metrics.k8s.io readable by whoever may view, a Service
    without a selector whose EndpointSlice names `address`, and the APIService verifying its serving cert by
    `ca_bundle` (the cluster CA's PEM)."""
    rbac = "rbac.authorization.k8s.io"
    user = [{"apiGroup": rbac, "kind": "User", "name": METRICS_SERVER_USER}]
    aggregate = {f"{rbac}/aggregate-to-{role}": "true" for role in ("admin", "edit", "view")}
    return [
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:aggregated-metrics-reader", "labels": aggregate},
         "rules": [{"apiGroups": ["metrics.k8s.io"], "resources": ["pods", "nodes"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRole", "metadata": {"name": METRICS_SERVER_USER},
         "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                   {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": METRICS_SERVER_USER},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": METRICS_SERVER_USER}, "subjects": user},
        {"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "metrics-server:system:auth-delegator"},
         "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "system:auth-delegator"}, "subjects": user},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding",
         "metadata": {"name": "metrics-server-auth-reader", "namespace": "kube-system"},
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "extension-apiserver-authentication-reader"},
         "subjects": user},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "metrics-server", "namespace": "kube-system"},
         "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP",
                             "targetPort": METRICS_SERVER_PORT}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "metrics-server", "namespace": "kube-system",
                      "labels": {"kubernetes.io/service-name": "metrics-server",
                                 "endpointslice.kubernetes.io/managed-by": "pynode-cluster"}},
         "addressType": "IPv4", "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
         "ports": [{"name": "https", "port": METRICS_SERVER_PORT, "protocol": "TCP"}]},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": "v1beta1.metrics.k8s.io"},
         "spec": {"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                  "versionPriority": 100, "caBundle": base64.b64encode(ca_bundle).decode(),
                  "service": {"name": "metrics-server", "namespace": "kube-system", "port": 443}}},
    ]


CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")  # in the order they start


def control_plane_argvs(*, address: str, port: int, pki: Path, etcd_dir: Path, etcd_ports: tuple[int, int],
                        kubeconfigs: Path, cluster_cidr: str = CLUSTER_CIDR, service_cidr: str = SERVICE_CIDR,
                        allocate_node_cidrs: bool = True, front_proxy: Path | None = None) -> dict[str, list[str]]:
    """Every control-plane daemon's command line, by name in CONTROL_PLANE's order: the apiserver on
    `address`:`port`, etcd beside it on loopback, the controller manager and the scheduler with the
    kubeconfigs named after them in `kubeconfigs` (pki.CONTROL_PLANE_USERS). `make cluster` runs them in a
    namespace, the lab as systemd units or on the host. `front_proxy`: as apiserver_argv's."""
    return {
        "etcd": etcd_argv(etcd_dir, *etcd_ports),
        "kube-apiserver": apiserver_argv(etcd=f"http://127.0.0.1:{etcd_ports[0]}", address=address, port=port,
                                         pki=pki, service_cidr=service_cidr, front_proxy=front_proxy),
        "kube-controller-manager": controller_manager_argv(
            kubeconfig=kubeconfigs / "controller-manager.kubeconfig", pki=pki, cluster_cidr=cluster_cidr,
            service_cidr=service_cidr, allocate_node_cidrs=allocate_node_cidrs),
        "kube-scheduler": scheduler_argv(kubeconfig=kubeconfigs / "scheduler.kubeconfig"),
    }
