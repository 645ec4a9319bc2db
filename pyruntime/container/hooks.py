"""OCI hooks: each gets the container's state JSON on stdin; the first failure stops the sequence."""
from __future__ import annotations

from pyruntime import fastjson
from pyruntime.errors import FailedPreconditionError

TYPE_CHECKING = False
if TYPE_CHECKING:  # `delete` and `start` import this module; the spec types are needed only when hooks exist
    from pyruntime.oci.spec import Hook


class HookError(FailedPreconditionError):
    """A hook named in the spec failed, timed out or could not be run: its veto, not the runtime's fault."""


def run_hooks(kind: str, hooks: tuple[Hook, ...], state: dict, inherit_env: dict[str, str] | None = None,
              cwd: str | None = None) -> None:
    """`inherit_env`: the environment of a hook that names none (startContainer hooks get the container
    process's, as runc's, which runs them from the process about to exec). `cwd`: where the hooks run,
    the current directory if None; runc runs create-time runtime hooks in the bundle and createContainer
    hooks in the rootfs, and hooks rely on it with relative paths. Errors say which hook by its index,
    in runc's words (`error running prestart hook #1: ...`)."""
    if not hooks:
        return
    import subprocess
    payload = fastjson.dumps(state).encode()
    for i, hook in enumerate(hooks):
        argv = list(hook.args) or [hook.path]
        env = dict(e.split("=", 1) for e in hook.env) if hook.env or inherit_env is None else inherit_env
        what = f"error running {kind} hook #{i}: {kind} hook {hook.path}"
        try:
            done = subprocess.run(argv, executable=hook.path, input=payload, env=env, timeout=hook.timeout,
                                  capture_output=True, cwd=cwd)
        except subprocess.TimeoutExpired as e:
            raise HookError(f"{what}: timed out after {hook.timeout}s") from e
        except OSError as e:
            raise HookError(f"{what}: {e.strerror}") from e
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).decode(errors="replace").strip()[-500:]
            raise HookError(f"{what}: {_ended(done.returncode)}" + (f": {detail}" if detail else ""))


def _ended(returncode: int) -> str:
    """How the hook ended, in Go's words as runc reports it: `exit status 3`, `signal: bad system call`."""
    if returncode >= 0:
        return f"exit status {returncode}"
    import signal
    name = signal.strsignal(-returncode) or f"signal {-returncode}"
    return f"signal: {name[:1].lower()}{name[1:]}"
