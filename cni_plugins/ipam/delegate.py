"""Runs the IPAM plugin named in `ipam.type` for a main plugin (SPEC section 4).

Our own host-local is called in the same process with the same request, which gives the same result as
exec'ing it without a second interpreter start; any other type is found on CNI_PATH and exec'd with the
caller's environment and the same stdin, as a CNI runtime would.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace

from cni_plugins.result import Result, ResultError
from cni_plugins.skel import ERR_DECODING_FAILURE, ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CmdArgs, CNIError

IN_PROCESS = ("pyhost-local",)


def _in_process():
    from cni_plugins.ipam.host_local import plugin
    return plugin


def _find(ipam_type: str, path: list[str]) -> str:
    if "/" in ipam_type or not ipam_type:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid IPAM plugin type {ipam_type!r}")
    for directory in path:
        candidate = os.path.join(directory, ipam_type)
        if os.access(candidate, os.X_OK):
            return candidate
    raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"failed to find plugin {ipam_type!r} in path {path}")


def _exec(ipam_type: str, args: CmdArgs, command: str) -> bytes:
    exe = _find(ipam_type, args.path)
    env = dict(args.env)
    env["CNI_COMMAND"] = command
    proc = subprocess.run([exe], input=args.stdin, env=env, stdout=subprocess.PIPE, check=False)
    if proc.returncode != 0:
        try:
            err = json.loads(proc.stdout)
            raise CNIError(int(err.get("code", ERR_INTERNAL)), err.get("msg", ""), err.get("details", ""))
        except (ValueError, TypeError, AttributeError):
            raise CNIError(ERR_INTERNAL, f"{ipam_type} {command} failed with status {proc.returncode}",
                           proc.stdout.decode(errors="replace")) from None
    return proc.stdout


def add(ipam_type: str, args: CmdArgs) -> Result:
    if ipam_type in IN_PROCESS:
        return _in_process().add(replace(args, command="ADD"))
    out = _exec(ipam_type, args, "ADD")
    try:
        return Result.from_json(json.loads(out))
    except (ValueError, ResultError) as exc:
        raise CNIError(ERR_DECODING_FAILURE, f"cannot decode the result of IPAM plugin {ipam_type}", str(exc)) from exc


def delete(ipam_type: str, args: CmdArgs) -> None:
    if ipam_type in IN_PROCESS:
        _in_process().delete(replace(args, command="DEL"))
    else:
        _exec(ipam_type, args, "DEL")


def check(ipam_type: str, args: CmdArgs) -> None:
    if ipam_type in IN_PROCESS:
        _in_process().check(replace(args, command="CHECK"))
    else:
        _exec(ipam_type, args, "CHECK")


def status(ipam_type: str, args: CmdArgs) -> None:
    if ipam_type in IN_PROCESS:
        _in_process().status(replace(args, command="STATUS"))
    else:
        _exec(ipam_type, args, "STATUS")


def gc(ipam_type: str, args: CmdArgs) -> None:
    if ipam_type in IN_PROCESS:
        _in_process().gc(replace(args, command="GC"))
    else:
        _exec(ipam_type, args, "GC")
