"""The API's DNS-1123 name formats (IsDNS1123Label, IsDNS1123Subdomain), which a pod's hostname and subdomain,
the node's name, a label key's prefix and the lab's node names are all checked by."""
from __future__ import annotations

import pytest

from pykubelet.api.names import is_dns1123_label, is_dns1123_subdomain


@pytest.mark.parametrize("value, label, subdomain", [
    ("a", True, True),
    ("web-0", True, True),
    ("0web", True, True),
    ("a" * 63, True, True),
    ("a" * 64, False, True),
    ("a.b", False, True),
    ("node-1.example.com", False, True),
    (".".join(["a" * 63] * 4)[:253], False, True),
    ("a" * 254, False, False),
    ("", False, False),
    ("-a", False, False),
    ("a-", False, False),
    ("A", False, False),
    ("a_b", False, False),
    ("a..b", False, False),
    ("a.", False, False),
    ("a.-b", False, False),
])
def test_dns1123_label_and_subdomain(value: str, label: bool, subdomain: bool) -> None:
    assert (is_dns1123_label(value), is_dns1123_subdomain(value)) == (label, subdomain)
