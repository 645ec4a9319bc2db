"""OCI hooks: each gets the container's state JSON on stdin; the first failure stops the sequence."""
from __future__ import annotations

import json

from pyruntime.errors import FailedPreconditionError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (PEP 781's idiom; type checkers know it)
if TYPE_CHECKING:  # `delete` and `start` import this module; the spec types are needed only when hooks exist
    from pyruntime.oci.spec import Hook


class HookError(FailedPreconditionError):
    """A hook named in the spec failed, timed out or could not be run: its veto, not the runtime's fault."""


def run_hooks(kind: str, hooks: tuple[Hook, ...], state: dict) -> None:
    if not hooks:
        return
    import subprocess
    payload = json.dumps(state).encode()
    for hook in hooks:
        argv = list(hook.args) or [hook.path]
        env = dict(e.split("=", 1) for e in hook.env)
        try:
            done = subprocess.run(argv, executable=hook.path, input=payload, env=env, timeout=hook.timeout,
                                  capture_output=True)
        except subprocess.TimeoutExpired as e:
            raise HookError(f"{kind} hook {hook.path}: timed out after {hook.timeout}s") from e
        except OSError as e:
            raise HookError(f"{kind} hook {hook.path}: {e.strerror}") from e
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).decode(errors="replace").strip()[-500:]
            raise HookError(
                f"{kind} hook {hook.path}: exit status {done.returncode}" + (f": {detail}" if detail else "")
            )
