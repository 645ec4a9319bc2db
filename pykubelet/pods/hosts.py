"""The pod's hostname and the /etc/hosts its containers see, as the kubelet makes them.

The hostname is the kubelet's GeneratePodHostNameAndDomain: spec.hostnameOverride when given (the whole name,
no domain: 1.37's HostnameOverride), else spec.hostname or the pod's name, cut to 63 characters, with the
domain SUBDOMAIN.NAMESPACE.svc.CLUSTER_DOMAIN when spec.subdomain is set; the kernel's nodename is the FQDN
only with setHostnameAsFQDN (GetNodenameForKernel). A hostNetwork pod has the node's name.

The hosts file is the kubelet's (KubeletManagedEtcHosts): written to PODDIR/etc-hosts and bind-mounted at
/etc/hosts of every container that does not mount that path itself, once the pod has an IP or is on the
host's network. It holds the localhost lines and each pod IP with the hostname (its FQDN first when there
is a domain); a hostNetwork pod gets the node's own /etc/hosts instead. Both end with spec.hostAliases.
The runtime's hosts file for the sandbox (containerd's, pyruntime-cri's) is then not mounted: both leave
/etc/hosts to a mount the kubelet asks for, so the kubelet's file is the one the containers see.
"""
from __future__ import annotations

from pathlib import Path

from pykubelet.api.names import is_dns1123_label, is_dns1123_subdomain
from pykubelet.api.podmodel import Container, HostAlias, Pod
from pykubelet.errors import FailedPreconditionError

ETC_HOSTS = "/etc/hosts"
MANAGED_HEADER = "# Kubernetes-managed hosts file.\n"
HOST_NETWORK_HEADER = "# Kubernetes-managed hosts file (host network).\n"
LOCALHOST = ("127.0.0.1\tlocalhost\n"
             "::1\tlocalhost ip6-localhost ip6-loopback\n"
             "fe00::0\tip6-localnet\n"
             "fe00::0\tip6-mcastprefix\n"
             "fe00::1\tip6-allnodes\n"
             "fe00::2\tip6-allrouters\n")
HOSTNAME_MAX = 63  # the kernel's nodename holds 64 bytes with its NUL
FQDN_MAX = 64


class HostnameError(FailedPreconditionError):
    """The pod's hostname cannot be made from its spec (a static pod's: the API server validates the rest)."""


def _truncate(pod_name: str, hostname: str) -> str:
    """At most 63 characters, not ending in '-' or '.', as the kubelet's truncatePodHostnameIfNeeded."""
    if len(hostname) <= HOSTNAME_MAX:
        return hostname
    cut = hostname[:HOSTNAME_MAX].rstrip("-.")
    if not cut:
        raise HostnameError(f"hostname for pod {pod_name!r} was invalid: {hostname!r}")
    return cut


def hostname_and_domain(pod: Pod, cluster_domain: str) -> tuple[str, str]:
    """The pod's hostname and its domain ("" for none), as the kubelet's GeneratePodHostNameAndDomain."""
    spec, meta = pod.spec, pod.metadata
    if spec.hostname_override is not None:
        if not is_dns1123_subdomain(spec.hostname_override):
            raise HostnameError(f"spec.hostnameOverride: {spec.hostname_override!r} is not a valid DNS subdomain")
        return _truncate(meta.name, spec.hostname_override), ""
    hostname = meta.name
    if spec.hostname:
        if not is_dns1123_label(spec.hostname):
            raise HostnameError(f"spec.hostname: {spec.hostname!r} is not a valid DNS label")
        hostname = spec.hostname
    hostname = _truncate(meta.name, hostname)
    if not spec.subdomain:
        return hostname, ""
    if not is_dns1123_label(spec.subdomain):
        raise HostnameError(f"spec.subdomain: {spec.subdomain!r} is not a valid DNS label")
    return hostname, f"{spec.subdomain}.{meta.namespace}.svc.{cluster_domain}"


def kernel_hostname(pod: Pod, cluster_domain: str) -> str:
    """The sandbox's hostname: none for a hostNetwork pod (it has the node's UTS namespace, whose name a runtime
    must not set), the FQDN with setHostnameAsFQDN and a domain, else the hostname (GetNodenameForKernel)."""
    if pod.spec.host_network:
        return ""
    hostname, domain = hostname_and_domain(pod, cluster_domain)
    if not (domain and pod.spec.set_hostname_as_fqdn):
        return hostname
    fqdn = f"{hostname}.{domain}"
    if len(fqdn) > FQDN_MAX:
        raise HostnameError(f"failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too "
                            f"long ({FQDN_MAX} characters is the max, {len(fqdn)} characters requested)")
    return fqdn


def _aliases(aliases: tuple[HostAlias, ...]) -> str:
    if not aliases:
        return ""
    return "\n# Entries added by HostAliases.\n" + "".join(f"{a.ip}\t{chr(9).join(a.hostnames)}\n" for a in aliases)


def managed_hosts(pod_ips: list[str], hostname: str, domain: str, aliases: tuple[HostAlias, ...]) -> bytes:
    """A pod-network pod's hosts file, as the kubelet's managedHostsFileContent."""
    names = f"{hostname}.{domain}\t{hostname}" if domain else hostname
    return (MANAGED_HEADER + LOCALHOST + "".join(f"{ip}\t{names}\n" for ip in pod_ips) + _aliases(aliases)).encode()


def node_hosts(node_file: bytes, aliases: tuple[HostAlias, ...]) -> bytes:
    """A hostNetwork pod's hosts file: the node's, with the pod's aliases (nodeHostsFileContent)."""
    return HOST_NETWORK_HEADER.encode() + node_file + _aliases(aliases).encode()


def mounts_hosts(pod: Pod, container: Container, pod_ips: list[str]) -> bool:
    """Whether the container gets the kubelet's hosts file (shouldMountHostsFile and makeMounts): the pod has
    an IP or the node's network, and the container mounts nothing of its own at /etc/hosts."""
    if not (pod_ips or pod.spec.host_network):
        return False
    return all(m.mount_path != ETC_HOSTS for m in container.volume_mounts)


def hosts_path(pod_dir: Path) -> Path:
    return pod_dir / "etc-hosts"
