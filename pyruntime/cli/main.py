"""`pyruntime`: the runc-compatible command line, so tools written for runc (containerd's shim,
runtime-tools, scripts) drive it unchanged. This module only parses and dispatches: each command
parses its flags and calls one method of pyruntime.runtime.Runtime (the library a CRI server uses
too), and imports nothing it does not use, because the start-up time of this process is part of
every container start. The environment is read here, into Settings, and nowhere below. JSON is read
with fastjson; only the commands that print it (with json's indents and separators) import `json`.
"""
from __future__ import annotations

import os
import sys

from pyruntime import fastjson
from pyruntime.cli.args import Flag, UsageError, parse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from pyruntime.linux.syscalls import Syscalls
    from pyruntime.runtime import Runtime

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
                "memory-swap": ("memory", "swap"), "cpu-share": ("cpu", "shares"), "cpu-quota": ("cpu", "quota"),
                "cpu-burst": ("cpu", "burst"), "cpu-idle": ("cpu", "idle"),
                "cpu-period": ("cpu", "period"), "cpuset-cpus": ("cpu", "cpus"), "cpuset-mems": ("cpu", "mems"),
                "cpu-rt-runtime": ("cpu", "realtimeRuntime"), "cpu-rt-period": ("cpu", "realtimePeriod"),
                "pids-limit": ("pids", "limit"), "blkio-weight": ("blockIO", "weight")}
# runc's lines, which tools parse field by field, with pyruntime's own version and what it runs on
VERSION = "runc version {v} (pyruntime {v})\ncommit: pyruntime-{v}\nspec: 1.2.1\npython: {py}"
PYRUNTIME_VERSION = "0.1.0"
# runc's help layout (NAME:, USAGE:), which scripts and the runc suite read; what each command does
SUMMARIES = {
    "checkpoint": "checkpoint a running container (not supported by pyruntime: no CRIU)",
    "create": "create a container",
    "delete": "delete any resources held by the container often used with detached container",
    "events": "display container events such as OOM notifications, cpu, memory, and IO usage statistics",
    "exec": "execute new process inside the container", "features": "show the enabled features",
    "image": "pull, list, inspect, remove, import, export and prune images (pyruntime's own)",
    "kill": "kill sends the specified signal (default: SIGTERM) to the container's init process",
    "list": "lists containers started by runc with the given root",
    "pause": "pause suspends all processes inside the container",
    "ps": "ps displays the processes running inside a container",
    "restore": "restore a container from a previous checkpoint (not supported by pyruntime: no CRIU)",
    "resume": "resumes all processes that have been previously paused", "run": "create and run a container",
    "spec": "create a new specification file", "start": "executes the user defined process in a created container",
    "state": "output the state of a container", "update": "update container resource constraints",
}


class Context:
    """The global flags, as Settings built here at the edge (flags over environment over defaults), and
    the runtime every command calls."""

    def __init__(self, opts: dict) -> None:
        from pyruntime.settings import Settings
        try:
            self.settings = Settings.from_env(root=str(opts["root"]), log=opts["log"],
                                              log_format=str(opts["log-format"]),
                                              debug=True if opts["debug"] else None,
                                              systemd_cgroup=True if opts["systemd-cgroup"] else None)
        except ValueError as e:  # InvalidArgumentError, naming the setting
            raise UsageError(str(e)) from e
        self.root = self.settings.root

    def runtime(self, kernel: Syscalls | None = None) -> Runtime:
        """`kernel`: the syscall layer a command that forks already made; the runtime makes its own if None."""
        from pyruntime.runtime import Runtime
        return Runtime(self.settings, kernel)

    def error(self, msg: str) -> None:
        """--log first: a shim reads the reason there, and may have given us stdio we cannot write to
        (containerd's sandbox runtime gets a read-only /dev/null)."""
        log = self.settings.log
        if log:
            from pyruntime import logline
            try:
                logline.write(log, self.settings.log_format, "error", msg)
            except OSError as e:
                _write_stderr(f"pyruntime: --log {log}: {e.strerror}\n")
        _write_stderr(f"pyruntime: {msg}\n")


def _write_stderr(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # nowhere left to say it; --log has it when one was given


def _settle_streams() -> None:
    """A stream that cannot be flushed is swapped for /dev/null, so the interpreter does not fail its own
    final flush and turn our exit status into 120 (runc's is 1 for any runtime error)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:  # started with that fd closed: nothing was written
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 (open until the interpreter exits)


def _one_id(pos: list[str], cmd: str) -> str:
    if len(pos) != 1:
        raise UsageError(f"{cmd}: expected exactly one container id, got {len(pos)} arguments")
    return pos[0]


class OwnConsole:
    """runc's behaviour for a foreground terminal without --console-socket: the runtime takes the
    pty master itself and relays it to its own stdin and stdout."""

    def __init__(self, root: str, kernel: Syscalls) -> None:
        from pynode_os.files import make_dirs
        from pyruntime.container.console import listen
        from pyruntime.container.store import ROOT_MODE
        make_dirs(root, ROOT_MODE, chmod=kernel.chmod)
        self.path = os.path.join(root, f".console-{os.getpid()}.sock")
        self.server = listen(self.path)

    def master(self) -> int:
        from pyruntime.container.console import receive_master
        return receive_master(self.server)

    def close(self) -> None:
        self.server.close()
        os.unlink(self.path)


def _text(o: dict, flag: str) -> str | None:
    """A flag's value, None when it was not given."""
    value = o[flag]
    return None if value is None else str(value)


def _preserve_fds(o: dict) -> int:
    text = str(o["preserve-fds"])
    if not text.isdigit():
        raise UsageError(f"--preserve-fds: {text!r} is not a whole number")
    return int(text)


def cmd_create(ctx: Context, argv: list[str]) -> int:
    p = parse(argv, CREATE_FLAGS)
    o = p.options
    ctx.runtime().create(_one_id(p.positional, "create"), str(o["bundle"]), console_socket=_text(o, "console-socket"),
                         pid_file=_text(o, "pid-file"), preserve_fds=_preserve_fds(o))
    return 0


def cmd_run(ctx: Context, argv: list[str]) -> int:
    from pyruntime.linux.syscalls import LinuxSyscalls
    from pyruntime.oci.spec import load_bundle
    p = parse(argv, CREATE_FLAGS + [Flag(("detach", "d")), Flag(("keep",))])
    o = p.options
    cid = _one_id(p.positional, "run")
    kernel = LinuxSyscalls()
    rt = ctx.runtime(kernel)
    spec = load_bundle(str(o["bundle"]))  # once: whether it wants a terminal, then what create makes

    def create(console_socket: str | None) -> int:
        return rt.create(cid, str(o["bundle"]), spec, console_socket=console_socket, pid_file=_text(o, "pid-file"),
                         preserve_fds=_preserve_fds(o)).pid

    def start() -> None:
        try:
            rt.start(cid)
        except BaseException:
            rt.delete(cid, force=True)
            raise

    code = _launch(ctx, kernel, o, spec.process is not None and spec.process.terminal, create, start)
    if not o["detach"] and not o["keep"]:
        rt.delete(cid, force=True)
    return code


def cmd_start(ctx: Context, argv: list[str]) -> int:
    ctx.runtime().start(_one_id(parse(argv, []).positional, "start"))
    return 0


def cmd_state(ctx: Context, argv: list[str]) -> int:
    import json
    print(json.dumps(ctx.runtime().state(_one_id(parse(argv, []).positional, "state")).to_json(), indent=2))
    return 0


def cmd_kill(ctx: Context, argv: list[str]) -> int:
    p = parse(argv, [Flag(("all", "a"))])
    if not 1 <= len(p.positional) <= 2:
        raise UsageError("kill: usage: pyruntime kill [--all] <container-id> [signal]")
    sig = p.positional[1] if len(p.positional) == 2 else "SIGTERM"
    ctx.runtime().kill(p.positional[0], sig, bool(p.options["all"]))
    return 0


def cmd_delete(ctx: Context, argv: list[str]) -> int:
    p = parse(argv, [Flag(("force", "f"))])
    ctx.runtime().delete(_one_id(p.positional, "delete"), bool(p.options["force"]))
    return 0


def _exec_process(rt: Runtime, cid: str, o: dict, args: list[str]) -> dict:
    """The process to exec: --process FILE as given, or the container's own process with the flags applied."""
    if o["process"]:
        with open(str(o["process"])) as f:
            return fastjson.load(f)
    if not args:
        raise UsageError("exec: give the command to run, or --process FILE")
    base = rt.process_of(cid)
    raw = {k: v for k, v in base.items() if k not in ("terminal", "consoleSize")}
    raw["args"] = args
    raw["env"] = list(base.get("env", [])) + list(o["env"])
    if o["cwd"]:
        raw["cwd"] = o["cwd"]
    if o["tty"]:
        raw["terminal"] = True
    if o["user"]:
        uid, _, gid = str(o["user"]).partition(":")
        raw["user"] = {"uid": int(uid), "gid": int(gid or 0)}
    if o["additional-gids"]:
        raw.setdefault("user", {})["additionalGids"] = [int(g) for g in o["additional-gids"]]
    if o["no-new-privs"]:
        raw["noNewPrivileges"] = True
    # runc's --cap: bounding, effective and permitted; ambient only where the spec already has inheritable
    # capabilities (an ambient one needs to be inheritable too), and never inheritable itself
    for cap in o["cap"]:
        spec_caps = raw.setdefault("capabilities", {})
        for kind in ("bounding", "effective", "permitted") + (("ambient",) if spec_caps.get("inheritable") else ()):
            caps = spec_caps.setdefault(kind, [])
            if cap not in caps:
                caps.append(cap)
    return raw


def cmd_exec(ctx: Context, argv: list[str]) -> int:
    from pyruntime.linux.syscalls import LinuxSyscalls
    from pyruntime.oci.spec import process_from_json
    p = parse(argv, EXEC_FLAGS, stop_at_positional=True)
    o = p.options
    if not p.positional:
        raise UsageError("exec: usage: pyruntime exec [flags] <container-id> <command> [args...]")
    cid, args = p.positional[0], p.positional[1:]
    kernel = LinuxSyscalls()
    rt = ctx.runtime(kernel)
    proc = process_from_json(_exec_process(rt, cid, o, args))

    def execute(console_socket: str | None) -> int:
        return rt.exec(cid, proc, console_socket=console_socket, pid_file=_text(o, "pid-file"),
                       preserve_fds=_preserve_fds(o))

    return _launch(ctx, kernel, o, proc.terminal, execute)


def _launch(ctx: Context, kernel: Syscalls, o: dict, terminal: bool, make: Callable[[str | None], int],
            then: Callable[[], None] | None = None) -> int:
    """What `run` and `exec` share once they know their process: `make(console_socket)` makes it and returns
    its pid, with --console-socket, or in the foreground with a terminal and no socket a console of our own
    whose pty master we relay (runc's); `then` runs next (run's start). Detached: 0 at once; in the
    foreground, as the subreaper of what the process leaves, its exit status once it exits."""
    from pyruntime.container.create import become_subreaper, wait_exit
    if not o["detach"]:
        become_subreaper(kernel)
    own = OwnConsole(ctx.root, kernel) if terminal and not o["detach"] and not o["console-socket"] else None
    try:
        pid = make(own.path if own else _text(o, "console-socket"))
        master = own.master() if own else None
    finally:
        if own:
            own.close()
    if then is not None:
        then()
    if o["detach"]:
        return 0
    if master is not None:
        from pyruntime.container.console import proxy
        proxy(master)
    return wait_exit(pid)


def cmd_list(ctx: Context, argv: list[str]) -> int:
    import json
    p = parse(argv, [Flag(("format", "f"), True, default="table"), Flag(("quiet", "q"))])
    # runc too reports a container it can't load and lists the others
    states = [s.to_json() for s in ctx.runtime().list(on_error=lambda _cid, e: ctx.error(f"list: {e}"))]
    if p.options["quiet"]:
        print("\n".join(s["id"] for s in states))
    elif p.options["format"] == "json":
        print(json.dumps(states, separators=(",", ":")))
    else:
        print(f"{'ID':<20} {'PID':<8} {'STATUS':<10} {'BUNDLE':<40} {'CREATED':<31} OWNER")
        for s in states:
            print(f"{s['id']:<20} {s['pid']:<8} {s['status']:<10} {s['bundle']:<40} {s['created']:<31} {s['owner']}")
    return 0


def cmd_ps(ctx: Context, argv: list[str]) -> int:
    """runc's: the host's ps(1) with the given options (default -ef), only the container's rows."""
    import json
    p = parse(argv, [Flag(("format", "f"), True, default="table")], stop_at_positional=True)
    if not p.positional:
        raise UsageError("ps: usage: pyruntime ps [--format table|json] <container-id> [ps options]")
    found = ctx.runtime().pids(p.positional[0])
    if p.options["format"] == "json":
        print(json.dumps(found))
        return 0
    import subprocess
    argv_ps = ["ps", *(p.positional[1:] or ["-ef"])]
    try:
        out = subprocess.run(argv_ps, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise UsageError(f"ps: {' '.join(argv_ps)}: {getattr(e, 'stderr', None) or e}") from e
    header, *rows = out.splitlines() or [""]
    if "PID" not in header.split():
        raise UsageError(f"ps: {' '.join(argv_ps)}: no PID column in its output")
    column = header.split().index("PID")
    print(header)
    wanted = {str(pid) for pid in found}
    for row in rows:
        fields = row.split()
        if len(fields) > column and fields[column] in wanted:
            print(row)
    return 0


def cmd_pause(ctx: Context, argv: list[str]) -> int:
    ctx.runtime().pause(_one_id(parse(argv, []).positional, "pause"))
    return 0


def cmd_resume(ctx: Context, argv: list[str]) -> int:
    ctx.runtime().resume(_one_id(parse(argv, []).positional, "resume"))
    return 0


def _bytes(flag: str, text: str) -> int:
    """A memory size as runc takes it (docker's units): a number of bytes, or with a binary suffix
    k, m, g, t, p (optionally followed by b or ib, any case): `50M` is 50 MiB; -1 is unlimited."""
    number = text.lower().removesuffix("ib").removesuffix("b")
    scale = 1
    if number and number[-1] in "kmgtp":
        scale = 1024 ** ("kmgtp".index(number[-1]) + 1)
        number = number[:-1]
    try:
        value = float(number) if "." in number else int(number)
    except ValueError:
        raise UsageError(f"update: --{flag}: {text!r} is not a whole number of bytes (or with k, m, g, t, p)") from None
    return int(value * scale) if value >= 0 else -1


def cmd_update(ctx: Context, argv: list[str]) -> int:
    # runc's flag is --cpu-share; --cpu-shares, the config's field name, is taken too
    p = parse(argv, [Flag(("resources", "r"), True)] + [Flag((n, "cpu-shares") if n == "cpu-share" else (n,), True)
                                                        for n in UPDATE_FLAGS]
              + [Flag(("kernel-memory",), True), Flag(("kernel-memory-tcp",), True)])
    cid = _one_id(p.positional, "update")
    raw: dict = {}
    if p.options["resources"]:
        src = str(p.options["resources"])
        if src == "-":
            raw = fastjson.load(sys.stdin)
        else:
            with open(src) as f:
                raw = fastjson.load(f)
    for flag, (section, key) in UPDATE_FLAGS.items():
        value = p.options[flag]
        if value is not None:
            text = str(value)
            if key in ("cpus", "mems"):
                raw.setdefault(section, {})[key] = text
            elif section == "memory":
                raw.setdefault(section, {})[key] = _bytes(flag, text)
            elif text.lstrip("-").isdigit():
                raw.setdefault(section, {})[key] = int(text)
            else:
                raise UsageError(f"update: --{flag}: {text!r} is not a whole number")
    ctx.runtime().update(cid, raw)
    return 0


def cmd_events(ctx: Context, argv: list[str]) -> int:
    import json
    p = parse(argv, [Flag(("stats",)), Flag(("interval",), True, default="5s")])
    cid = _one_id(p.positional, "events")
    rt = ctx.runtime()
    if p.options["stats"]:
        print(json.dumps(rt.stats(cid), separators=(",", ":")))
        return 0
    text = str(p.options["interval"])
    try:
        interval = float(text.removesuffix("s"))
    except ValueError:
        raise UsageError(f"events: --interval: {text!r} is not a duration in seconds (5s)") from None
    for event in rt.events(cid, interval):
        print(json.dumps(event, separators=(",", ":")), flush=True)
    return 0


def cmd_spec(ctx: Context, argv: list[str]) -> int:
    import json

    from pyruntime.linux import cgroups
    from pyruntime.linux.syscalls import LinuxSyscalls
    from pyruntime.oci.default import default_spec
    p = parse(argv, [Flag(("bundle", "b"), True, default="."), Flag(("rootless",))])
    v2 = cgroups.detect(LinuxSyscalls()) == "v2"
    path = os.path.join(str(p.options["bundle"]), "config.json")
    if os.path.exists(path):
        raise UsageError(f"File {path} exists. Remove it first")
    with open(path, "w") as f:
        json.dump(default_spec(bool(p.options["rootless"]), cgroup_ns=v2), f, indent="\t")
    return 0


def cmd_features(ctx: Context, argv: list[str]) -> int:
    import json

    from pyruntime.linux.syscalls import LinuxSyscalls
    from pyruntime.oci.features import features
    parse(argv, [])
    print(json.dumps(features(LinuxSyscalls()), indent=4))
    return 0


def cmd_image(ctx: Context, argv: list[str]) -> int:
    from pyruntime.cli.image import main as image_main
    return image_main(argv, ctx.settings)


COMMANDS = {
    "create": cmd_create, "run": cmd_run, "start": cmd_start, "state": cmd_state, "kill": cmd_kill,
    "delete": cmd_delete, "exec": cmd_exec, "list": cmd_list, "ps": cmd_ps, "pause": cmd_pause,
    "resume": cmd_resume, "update": cmd_update, "events": cmd_events, "spec": cmd_spec, "features": cmd_features,
    "image": cmd_image,
}


def _help() -> str:
    return ("NAME:\n   pyruntime - a Python runc - Open Container Initiative runtime\n\nUSAGE:\n"
            "   pyruntime [global options] command [command options] [arguments...]\n\nCOMMANDS:\n"
            + "".join(f"   {name:<11} {SUMMARIES[name]}\n" for name in sorted(SUMMARIES))
            + "\nGLOBAL OPTIONS:\n   --root value, --log value, --log-format text|json, --debug, --help, -h, "
              "--version, -v")


def main(argv: list[str] | None = None) -> int:
    status = _main(sys.argv[1:] if argv is None else argv)
    _settle_streams()
    return status


def _main(argv: list[str]) -> int:
    ctx: Context | None = None
    name = None  # set once the command is known; until then an error is about the global flags
    try:
        g = parse(argv, GLOBAL_FLAGS, stop_at_positional=True)
        if g.options["version"]:
            print(VERSION.format(v=PYRUNTIME_VERSION, py=sys.version.split()[0]))
            return 0
        if not g.positional or g.options["help"]:
            print(_help(), file=sys.stderr if not g.options["help"] else sys.stdout)
            return 0 if g.options["help"] else 1
        if g.positional[1:2] in (["-h"], ["--help"]) or g.positional[0] == "help":
            topic = g.positional[1] if g.positional[0] == "help" and len(g.positional) > 1 else g.positional[0]
            if topic == "help":
                print(_help())
                return 0
            if topic not in SUMMARIES:
                raise UsageError(f"No help topic for '{topic}'")
            print(f"NAME:\n   pyruntime {topic} - {SUMMARIES[topic]} (as runc {topic})\n\n"
                  f"USAGE:\n   pyruntime [global options] {topic} [command options] [arguments...]")
            return 0
        ctx = Context(g.options)
        command = COMMANDS.get(g.positional[0])
        if command is None:
            why = ("checkpoint/restore are not supported" if g.positional[0] in ("checkpoint", "restore")
                   else "see pyruntime --help")
            raise UsageError(f"unknown command {g.positional[0]!r} ({why})")
        name = g.positional[0]
        return command(ctx, g.positional[1:])
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        from pyruntime.cli.errors import is_bug, report
        if is_bug(e) or (ctx is not None and ctx.settings.debug):
            import traceback
            _write_stderr(traceback.format_exc())
        status, line = report(e, name)
        if name == "exec":
            status = 255  # runc's exec: its own failures are 255, apart from the process's exit statuses
        if ctx is None:
            _write_stderr(f"pyruntime: {line}\n")  # before --log is known
        else:
            ctx.error(line)
        return status
