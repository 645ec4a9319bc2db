"""/configz: the running configuration as the stock kubelet serves it, {"kubeletconfig": {...}} with the
KubeletConfiguration's v1beta1 field names and the values written as a config file writes them (durations
as Go prints them, "4h0m0s"; quantities as "10Mi"; eviction thresholds as "100Mi" or "10%"), kind and
apiVersion included, empty values left out (the v1beta1 fields are omitempty).

What is served is read from Settings through `fields`: v1beta1 field path -> (Settings attribute, writer),
built from pykubelet.config.FILE_FIELDS, so a field the kubelet takes from a file (or the flag that sets the
same attribute) is the field it shows.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pykubelet import config
from pykubelet.config import Settings
from pykubelet.durations import duration, duration_string
from pykubelet.eviction.policy import Value, format_quantity

Writer = Callable[[Any], Any]


def _threshold(value: Value) -> str:
    if value.quantity is not None:
        return format_quantity(value.quantity)
    return f"{(value.percentage or 0.0) * 100:g}%"


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def _reserved(amounts: dict[str, int]) -> dict[str, str]:
    """systemReserved, kubeReserved: cpu in millicores, memory and storage in bytes, pids as counted."""
    return {k: f"{v}m" if k == "cpu" else str(v) if k == "pid" else format_quantity(v) for k, v in amounts.items()}


def _go_cipher_name(openssl: str) -> str:
    return next(go for go, name in config.CIPHER_SUITES.items() if name == openssl)


# a field's parser -> how its Settings value is written back
WRITERS: dict[Any, Writer] = {
    duration: duration_string,
    config.quantity: format_quantity,
    config.EVICTION_VALUES: lambda m: {k: _threshold(v) for k, v in m.items()},
    config.EVICTION_DURATIONS: lambda m: {k: duration_string(v) for k, v in m.items()},
    config.tls_version: lambda v: next(go for go, version in config.TLS_VERSIONS.items() if version == v),
    config.cipher_suites: lambda suites: [_go_cipher_name(s) for s in suites],
    config.reserved: _reserved,
}


def fields_from(table: Mapping[str, config.Field]) -> dict[str, tuple[str, Writer]]:
    """field path -> (attribute, writer) from the config's field table; the fields without an attribute
    (accepted, not implemented, or taken with one value only) are not shown."""
    return {name: (f.attr, WRITERS.get(f.parse, _plain)) for name, f in table.items() if f.attr is not None}


def kubelet_configuration(settings: Settings, fields: Mapping[str, tuple[str, Writer]] | None = None) -> dict:
    """The v1beta1 KubeletConfiguration document of `settings`."""
    doc: dict[str, Any] = {}
    for name, (attr, write) in (fields if fields is not None else fields_from(config.FILE_FIELDS)).items():
        value = getattr(settings, attr)
        if value is None or value == "" or value == [] or value == {}:
            continue
        *parents, leaf = name.split(".")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = write(value)
    return doc | {"kind": config.KIND, "apiVersion": config.API_VERSION}


def configz(settings: Settings, fields: Mapping[str, tuple[str, Writer]] | None = None) -> bytes:
    """The body of /configz."""
    return json.dumps({"kubeletconfig": kubelet_configuration(settings, fields)}).encode()
