"""The lab made by kubeadm (`LAB_KUBEADM=1 vagrant up`): what a kubeadm host has that the lab's own units do not,
for lab.py's apply. The control-plane VM runs `kubeadm init`, each node VM `kubeadm join`, every VM pykubelet on
pyruntime-cri, as kubeadm Vagrant labs are built:
- the kubelet is the packaged `kubelet.service` with kubeadm's `10-kubeadm.conf` drop-in (kubernetes/release's
  packaging, which kubeadm writes kubeadm-flags.env and config.yaml for), `/usr/bin/kubelet` being pykubelet;
- the join needs nothing from the control plane's VM: `lab.py prepare` made the CA (kubeadm init takes a CA it
  finds in /etc/kubernetes/pki) and a bootstrap token, which init creates, so every node's JoinConfiguration is
  known before any VM boots (the token and the CA's public-key hash in lab.json);
- the pod CIDRs stay lab.json's (no podSubnet: the controller manager allocates none), the control plane's VM a
  node too, with the cluster CIDR's first /24.

Trust: as the lab's (lab.py): the token and the CA key come from the host that made the VMs.
"""
from __future__ import annotations

import hashlib
import secrets
import string

import yaml

from pynode_cluster.components import CLUSTER_DOMAIN
from pynode_cluster.kubeadm_config import KUBEADM_API, KUBERNETES_VERSION, registration

KUBELET_BINARY = "/usr/bin/kubelet"
# kubernetes/release's kubelet.service and its kubeadm drop-in (rpm/deb packaging), as a kubeadm host has them
KUBELET_SERVICE = """[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""
KUBEADM_DROP_IN = """# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
--kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the KUBELET_KUBEADM_ARGS
# variable dynamically
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
# This is a file that the user can use for overrides of the kubelet args as a last resort.
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"""
# kubeadm's own waits are for a real machine; a VM under software emulation starts the control plane slower
TIMEOUTS = {"controlPlaneComponentHealthCheck": "20m0s", "kubeletHealthCheck": "10m0s",
            "kubernetesAPICall": "5m0s", "tlsBootstrap": "15m0s", "discovery": "15m0s"}


def new_token() -> str:
    """A bootstrap token, as `kubeadm token generate` makes one: [a-z0-9]{6}.[a-z0-9]{16}."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(6)) + "." + "".join(
        secrets.choice(alphabet) for _ in range(16))


def ca_cert_hash(ca_pem: bytes) -> str:
    """kubeadm's --discovery-token-ca-cert-hash: sha256 of the CA certificate's SubjectPublicKeyInfo (DER)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    spki = x509.load_pem_x509_certificate(ca_pem).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def kubelet_wrapper(pykubelet: str) -> str:
    """/usr/bin/kubelet: pykubelet under the name kubeadm (preflight's `kubelet --version`) and the unit call."""
    return f"#!/bin/sh\nexec {pykubelet} \"$@\"\n"


def init_config(*, name: str, address: str, port: int, cri_socket: str, token: str, service_cidr: str,
                cluster_cidr: str) -> str:
    """kubeadm init's configuration for the control plane's VM: the lab's token, kept (ttl 0: nodes may join
    any time later), no podSubnet (lab.json's CIDRs), the systemd cgroup driver (the VMs boot systemd; the
    runtime says the same over CRI), kube-proxy told the cluster CIDR it would otherwise take from podSubnet."""
    return yaml.safe_dump_all([
        {"apiVersion": KUBEADM_API, "kind": "InitConfiguration",
         "bootstrapTokens": [{"token": token, "ttl": "0s"}],
         "localAPIEndpoint": {"advertiseAddress": address, "bindPort": port},
         "nodeRegistration": registration(name, address, cri_socket), "timeouts": TIMEOUTS},
        {"apiVersion": KUBEADM_API, "kind": "ClusterConfiguration", "kubernetesVersion": KUBERNETES_VERSION,
         "networking": {"serviceSubnet": service_cidr, "dnsDomain": CLUSTER_DOMAIN}},
        {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "cgroupDriver": "systemd"},
        {"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
         "clusterCIDR": cluster_cidr},
    ])


def join_config(*, name: str, address: str, cri_socket: str, server: str, token: str, ca_hash: str) -> str:
    """kubeadm join's configuration for a node VM, from lab.json alone."""
    return yaml.safe_dump({
        "apiVersion": KUBEADM_API, "kind": "JoinConfiguration",
        "discovery": {"bootstrapToken": {"apiServerEndpoint": server, "token": token, "caCertHashes": [ca_hash]}},
        "nodeRegistration": registration(name, address, cri_socket), "timeouts": TIMEOUTS})
