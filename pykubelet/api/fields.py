"""The kubelet's reader of API objects' JSON fields: pynode_os.fieldreader's, raising FieldError.

The same reader, and the same wording, as the runtime's for config.json
(`spec.containers[0].ports[1].containerPort: must be an integer, got "80"`).
"""
from __future__ import annotations

import builtins
import json

from pykubelet.errors import InvalidArgumentError
from pynode_os import fieldreader


class FieldError(InvalidArgumentError):
    """An API object the kubelet cannot act on; the message starts with the field's path."""


class Obj(fieldreader.Obj):
    """One JSON object of an API object at `path` ("" for the document itself)."""

    __slots__ = ()
    error_type = FieldError
    root = "object"
    dumps = staticmethod(json.dumps)

    def quantities(self, key: builtins.str) -> dict[builtins.str, builtins.str]:
        """A resource list ({"cpu": "100m", "memory": 64Mi}): the quantities as strings, as the API writes
        them (a manifest may give a bare number)."""
        value = self.get(key, dict, {})
        for k, v in value.items():
            self.check_type(v, f"{self.name(key)}[{json.dumps(k)}]", (builtins.str, builtins.int, float))
        return {k: v if isinstance(v, builtins.str) else str(v) for k, v in value.items()}

