"""`pyruntime`: the runc-compatible command line, so tools written for runc (containerd's shim,
runtime-tools, scripts) drive it unchanged. This module only parses and dispatches: each command is
a few lines over pyruntime.container, and imports nothing it does not use, because the start-up
time of this process is part of every container start.
"""
from __future__ import annotations

import json
import os
import sys
import time

from pyruntime.cli.args import Flag, UsageError, parse

GLOBAL_FLAGS = [Flag(("root",), True, default="/run/pyruntime"), Flag(("log",), True), Flag(("log-format",), True,
                default="text"), Flag(("debug",)), Flag(("systemd-cgroup",)), Flag(("criu",), True),
                Flag(("rootless",), True), Flag(("help", "h")), Flag(("version", "v"))]
NO_PIDFD = "use --pid-file"
CREATE_FLAGS = [Flag(("bundle", "b"), True, default="."), Flag(("console-socket",), True), Flag(("pid-file",), True),
                Flag(("no-pivot",), unsupported="pyruntime always uses pivot_root (ramdisk roots are not supported)"),
                # pyruntime never makes a session keyring, so this one asks for what it always does
                Flag(("no-new-keyring",)), Flag(("preserve-fds",), True, default="0"),
                Flag(("pidfd-socket",), True, unsupported=NO_PIDFD)]
EXEC_FLAGS = [Flag(("console-socket",), True), Flag(("cwd",), True), Flag(("env", "e"), True, repeat=True),
              Flag(("tty", "t")), Flag(("user", "u"), True), Flag(("additional-gids", "g"), True, repeat=True),
              Flag(("process", "p"), True), Flag(("detach", "d")), Flag(("pid-file",), True),
              Flag(("process-label",), True, unsupported="SELinux labels are not supported"),
              Flag(("apparmor",), True, unsupported="AppArmor profiles are not supported"), Flag(("no-new-privs",)),
              Flag(("cap", "c"), True, repeat=True), Flag(("preserve-fds",), True, default="0"),
              Flag(("cgroup",), True, repeat=True, unsupported="exec into a sub-cgroup is not supported"),
              Flag(("ignore-paused",), unsupported="the new process would join the frozen cgroup and freeze; resume "
                   "the container first"),
              Flag(("pidfd-socket",), True, unsupported=NO_PIDFD)]
UPDATE_FLAGS = {"memory": ("memory", "limit"), "memory-reservation": ("memory", "reservation"),
                "memory-swap": ("memory", "swap"), "cpu-shares": ("cpu", "shares"), "cpu-quota": ("cpu", "quota"),
                "cpu-period": ("cpu", "period"), "cpuset-cpus": ("cpu", "cpus"), "cpuset-mems": ("cpu", "mems"),
                "cpu-rt-runtime": ("cpu", "realtimeRuntime"), "cpu-rt-period": ("cpu", "realtimePeriod"),
                "pids-limit": ("pids", "limit"), "blkio-weight": ("blockIO", "weight")}
VERSION = "pyruntime version 0.1.0\nspec: 1.2.1"


class Context:
    def __init__(self, opts: dict) -> None:
        self.root = str(opts["root"])
        self.log = opts["log"]
        self.json_log = opts["log-format"] == "json"
        if opts["systemd-cgroup"]:
            raise UsageError("--systemd-cgroup: the systemd cgroup driver is not supported; use cgroupfs paths")

    def store(self):
        from pyruntime.container.store import Store
        return Store(self.root)

    def error(self, msg: str) -> None:
        sys.stderr.write(f"pyruntime: {msg}\n")
        if self.log:
            line = json.dumps({"level": "error", "msg": msg, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) \
                if self.json_log else f"level=error msg={msg!r}"
            try:
                with open(self.log, "a") as f:
                    f.write(line + "\n")
            except OSError:
                pass


def _one_id(pos: list[str], cmd: str) -> str:
    if len(pos) != 1:
        raise UsageError(f"{cmd}: expected exactly one container id, got {len(pos)} arguments")
    return pos[0]


def _wants_terminal(bundle: str) -> bool:
    try:
        with open(os.path.join(bundle, "config.json"), "rb") as f:
            return bool((json.load(f).get("process") or {}).get("terminal"))
    except (OSError, ValueError, AttributeError):
        return False  # create reports what is wrong with the bundle


class OwnConsole:
    """runc's behaviour for a foreground terminal without --console-socket: the runtime takes the
    pty master itself and relays it to its own stdin and stdout."""

    def __init__(self, root: str) -> None:
        from pyruntime.container.console import listen
        os.makedirs(root, mode=0o711, exist_ok=True)
        self.path = os.path.join(root, f".console-{os.getpid()}.sock")
        self.server = listen(self.path)

    def master(self) -> int:
        from pyruntime.container.console import receive_master
        return receive_master(self.server)

    def close(self) -> None:
        self.server.close()
        os.unlink(self.path)


def cmd_create(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container.create import create
    p = parse(argv, CREATE_FLAGS)
    o = p.options
    create(ctx.store(), _one_id(p.positional, "create"), str(o["bundle"]), console_socket=o["console-socket"],
           pid_file=o["pid-file"], preserve_fds=int(o["preserve-fds"]))
    return 0


def cmd_run(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container import control
    from pyruntime.container.create import become_subreaper, create, wait_exit
    from pyruntime.linux.syscalls import LinuxSyscalls
    p = parse(argv, CREATE_FLAGS + [Flag(("detach", "d")), Flag(("keep",))])
    o = p.options
    store = ctx.store()
    cid = _one_id(p.positional, "run")
    kernel = LinuxSyscalls()
    if not o["detach"]:
        become_subreaper(kernel)
    own = None
    if not o["detach"] and not o["console-socket"] and _wants_terminal(str(o["bundle"])):
        own = OwnConsole(ctx.root)
    try:
        state = create(store, cid, str(o["bundle"]), console_socket=own.path if own else o["console-socket"],
                       pid_file=o["pid-file"], preserve_fds=int(o["preserve-fds"]), kernel=kernel)
        master = own.master() if own else None
    finally:
        if own:
            own.close()
    try:
        control.start(store, cid)
    except BaseException:
        control.delete(store, cid, force=True)
        raise
    if o["detach"]:
        return 0
    if master is not None:
        from pyruntime.container.console import proxy
        proxy(master)
    code = wait_exit(state.pid)
    if not o["keep"]:
        control.delete(store, cid, force=True)
    return code


def cmd_start(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container.control import start
    start(ctx.store(), _one_id(parse(argv, []).positional, "start"))
    return 0


def cmd_state(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container.control import query
    print(json.dumps(query(ctx.store(), _one_id(parse(argv, []).positional, "state")), indent=2))
    return 0


def cmd_kill(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container import control
    p = parse(argv, [Flag(("all", "a"))])
    if not 1 <= len(p.positional) <= 2:
        raise UsageError("kill: usage: pyruntime kill [--all] <container-id> [signal]")
    sig = control.parse_signal(p.positional[1] if len(p.positional) == 2 else "SIGTERM")
    control.kill(ctx.store(), p.positional[0], sig, bool(p.options["all"]))
    return 0


def cmd_delete(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container import control
    from pyruntime.container.store import NotFound
    p = parse(argv, [Flag(("force", "f"))])
    try:
        control.delete(ctx.store(), _one_id(p.positional, "delete"), bool(p.options["force"]))
    except NotFound:
        if not p.options["force"]:
            raise
    return 0


def _exec_process(ctx: Context, cid: str, o: dict, args: list[str]):
    from pyruntime.oci.spec import process_from_json
    if o["process"]:
        with open(str(o["process"])) as f:
            raw = json.load(f)
    else:
        if not args:
            raise UsageError("exec: give the command to run, or --process FILE")
        base = ctx.store().load(cid).config.get("process") or {}
        raw = {k: v for k, v in base.items() if k not in ("terminal", "consoleSize")}
        raw["args"] = args
        raw["env"] = list(base.get("env", [])) + list(o["env"])  # type: ignore[arg-type]
        if o["cwd"]:
            raw["cwd"] = o["cwd"]
        if o["tty"]:
            raw["terminal"] = True
        if o["user"]:
            uid, _, gid = str(o["user"]).partition(":")
            raw["user"] = {"uid": int(uid), "gid": int(gid or 0)}
        if o["additional-gids"]:
            raw.setdefault("user", {})["additionalGids"] = [int(g) for g in o["additional-gids"]]  # type: ignore
        if o["no-new-privs"]:
            raw["noNewPrivileges"] = True
        for cap in o["cap"]:  # type: ignore[union-attr]
            for kind in ("bounding", "effective", "permitted", "ambient", "inheritable"):
                caps = raw.setdefault("capabilities", {}).setdefault(kind, [])
                if cap not in caps:
                    caps.append(cap)
    return process_from_json(raw)


def cmd_exec(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container.create import become_subreaper, wait_exit, write_pid_file
    from pyruntime.container.exec import exec_process
    from pyruntime.linux.syscalls import LinuxSyscalls
    p = parse(argv, EXEC_FLAGS, stop_at_positional=True)
    o = p.options
    if not p.positional:
        raise UsageError("exec: usage: pyruntime exec [flags] <container-id> <command> [args...]")
    cid, args = p.positional[0], p.positional[1:]
    proc = _exec_process(ctx, cid, o, args)
    kernel = LinuxSyscalls()
    if not o["detach"]:
        become_subreaper(kernel)
    own = OwnConsole(ctx.root) if proc.terminal and not o["detach"] and not o["console-socket"] else None
    try:
        pid = exec_process(ctx.store(), cid, proc, console_socket=own.path if own else o["console-socket"],
                           preserve_fds=int(o["preserve-fds"]), kernel=kernel)
        master = own.master() if own else None
    finally:
        if own:
            own.close()
    if o["pid-file"]:
        write_pid_file(str(o["pid-file"]), pid)
    if o["detach"]:
        return 0
    if master is not None:
        from pyruntime.container.console import proxy
        proxy(master)
    return wait_exit(pid)


def cmd_list(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container.control import status_of
    from pyruntime.container.store import NotFound
    from pyruntime.errors import PyRuntimeError
    from pyruntime.oci.state import oci_state
    p = parse(argv, [Flag(("format", "f"), True, default="table"), Flag(("quiet", "q"))])
    store = ctx.store()
    states = []
    for cid in store.ids():
        try:
            st = store.load(cid)
        except NotFound:
            continue  # deleted since the directory was listed
        except PyRuntimeError as e:
            ctx.error(f"list: {e}")  # runc too reports a container it can't load and lists the others
            continue
        states.append(oci_state(st, status_of(store, st)))
    if p.options["quiet"]:
        print("\n".join(s["id"] for s in states))
    elif p.options["format"] == "json":
        print(json.dumps(states))
    else:
        print(f"{'ID':<20} {'PID':<8} {'STATUS':<10} {'BUNDLE':<40} {'CREATED':<31} OWNER")
        for s in states:
            print(f"{s['id']:<20} {s['pid']:<8} {s['status']:<10} {s['bundle']:<40} {s['created']:<31} {s['owner']}")
    return 0


def cmd_ps(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container.control import pids
    p = parse(argv, [Flag(("format", "f"), True, default="table")])
    if not p.positional:
        raise UsageError("ps: usage: pyruntime ps [--format table|json] <container-id> [ps options]")
    found = pids(ctx.store(), p.positional[0])
    if p.options["format"] == "json":
        print(json.dumps(found))
        return 0
    print(f"{'PID':>8} CMD")
    for pid in found:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        print(f"{pid:>8} {cmd}")
    return 0


def cmd_pause(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container.control import pause
    pause(ctx.store(), _one_id(parse(argv, []).positional, "pause"))
    return 0


def cmd_resume(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container.control import resume
    resume(ctx.store(), _one_id(parse(argv, []).positional, "resume"))
    return 0


def cmd_update(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container.control import update
    p = parse(argv, [Flag(("resources", "r"), True)] + [Flag((n,), True) for n in UPDATE_FLAGS]
              + [Flag(("kernel-memory",), True), Flag(("kernel-memory-tcp",), True)])
    cid = _one_id(p.positional, "update")
    raw: dict = {}
    if p.options["resources"]:
        src = str(p.options["resources"])
        if src == "-":
            raw = json.load(sys.stdin)
        else:
            with open(src) as f:
                raw = json.load(f)
    for flag, (section, key) in UPDATE_FLAGS.items():
        value = p.options[flag]
        if value is not None:
            text = str(value)
            if key not in ("cpus", "mems") and not text.lstrip("-").isdigit():
                raise UsageError(f"update: --{flag}: {text!r} is not a whole number")
            raw.setdefault(section, {})[key] = text if key in ("cpus", "mems") else int(text)
    update(ctx.store(), cid, raw)
    return 0


def cmd_events(ctx: Context, argv: list[str]) -> int:
    from pyruntime.container import control
    from pyruntime.container.store import ContainerError, NotFound
    p = parse(argv, [Flag(("stats",)), Flag(("interval",), True, default="5s")])
    cid = _one_id(p.positional, "events")
    store = ctx.store()
    if p.options["stats"]:
        print(json.dumps(control.stats(store, cid)))
        return 0
    interval = float(str(p.options["interval"]).rstrip("s"))
    ooms = control.oom_count(store, cid)
    while True:
        try:
            stats = control.stats(store, cid)
            now = control.oom_count(store, cid)
        except (ContainerError, NotFound):
            return 0  # the container stopped or was deleted: the stream ends
        print(json.dumps(stats), flush=True)
        if now > ooms:
            print(json.dumps({"type": "oom", "id": cid}), flush=True)
            ooms = now
        time.sleep(interval)


def cmd_spec(ctx: Context, argv: list[str]) -> int:
    from pyruntime.oci.default import default_spec
    p = parse(argv, [Flag(("bundle", "b"), True, default="."), Flag(("rootless",))])
    path = os.path.join(str(p.options["bundle"]), "config.json")
    if os.path.exists(path):
        raise UsageError(f"File {path} exists. Remove it first")
    with open(path, "w") as f:
        json.dump(default_spec(bool(p.options["rootless"])), f, indent="\t")
    return 0


def cmd_features(ctx: Context, argv: list[str]) -> int:
    from pyruntime.linux.syscalls import LinuxSyscalls
    from pyruntime.oci.features import features
    parse(argv, [])
    print(json.dumps(features(LinuxSyscalls()), indent=4))
    return 0


def cmd_image(ctx: Context, argv: list[str]) -> int:
    from pyruntime.cli.image import main as image_main
    return image_main(argv)


COMMANDS = {
    "create": cmd_create, "run": cmd_run, "start": cmd_start, "state": cmd_state, "kill": cmd_kill,
    "delete": cmd_delete, "exec": cmd_exec, "list": cmd_list, "ps": cmd_ps, "pause": cmd_pause,
    "resume": cmd_resume, "update": cmd_update, "events": cmd_events, "spec": cmd_spec, "features": cmd_features,
    "image": cmd_image,
}
USAGE = "usage: pyruntime [global options] COMMAND [options] ...\ncommands: " + ", ".join(COMMANDS)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ctx: Context | None = None
    name = None  # set once the command is known; until then an error is about the global flags
    try:
        g = parse(argv, GLOBAL_FLAGS, stop_at_positional=True)
        if g.options["version"]:
            print(VERSION)
            return 0
        if not g.positional or g.options["help"]:
            print(USAGE, file=sys.stderr if not g.options["help"] else sys.stdout)
            return 0 if g.options["help"] else 1
        ctx = Context(g.options)
        command = COMMANDS.get(g.positional[0])
        if command is None:
            why = "checkpoint/restore are not supported" if g.positional[0] in ("checkpoint", "restore") else USAGE
            raise UsageError(f"unknown command {g.positional[0]!r} ({why})")
        name = g.positional[0]
        return command(ctx, g.positional[1:])
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        from pyruntime.cli.errors import is_bug, report
        if is_bug(e) or os.environ.get("PYRUNTIME_DEBUG"):
            import traceback
            traceback.print_exc()
        status, line = report(e, name)
        if ctx is None:
            sys.stderr.write(f"pyruntime: {line}\n")  # before --log is known
        else:
            ctx.error(line)
        return status
