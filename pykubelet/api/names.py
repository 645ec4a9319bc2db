"""The API's DNS-1123 name formats, as k8s.io/apimachinery's IsDNS1123Label and IsDNS1123Subdomain check them.

One check for every part that names things as the API server would have them, so the node refuses what the
API server would and nothing more: a pod's hostname and subdomain (pods/hosts.py), the node's name and a label
key's prefix (config.py), the lab's node names (pynode_cluster/lab.py).
"""
from __future__ import annotations

import re

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def is_dns1123_label(value: str) -> bool:
    """At most 63 lower-case letters, digits and '-', starting and ending with a letter or a digit."""
    return len(value) <= DNS1123_LABEL_MAX and _DNS1123_LABEL.fullmatch(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    """DNS-1123 labels joined by '.', at most 253 characters in all."""
    return len(value) <= DNS1123_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(value) is not None
