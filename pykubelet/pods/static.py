"""Static pods: pods that come from files on the node (--pod-manifest-path, staticPodPath) instead of the API
server, so a node can run its own control plane, or anything at all with no API server (standalone mode).

The files are the authority, and they are read by the kubelet alone, with no API server to validate or
default them: so this does what the API server would for the fields the kubelet reads (namespace
`default`, restartPolicy Always, dnsPolicy ClusterFirst, terminationGracePeriodSeconds 30, imagePullPolicy
by tag, ...), checks the rest strictly (an unknown field or a wrong type is an error naming the file and
the field path, since a silently dropped field is a pod that runs differently from what its author wrote),
and skips a bad file with a log line while every other manifest keeps running.

Identity, as the kubelet's: the UID is a hash of the parsed manifest, the node's name and the file's path,
so an unchanged manifest keeps its UID across kubelet restarts (its containers are adopted, not restarted)
and any change to it makes a new pod (the old one is stopped, the new one started). The name gets the
node's name as a suffix (`web` on node `n1` runs as `web-n1`), so the static pods of many nodes can have
mirror pods side by side in one namespace.

Mirror pods: with an API server, each static pod is shown there as a mirror pod (annotation
kubernetes.io/config.mirror, owned by the Node as NodeRestriction demands) carrying the static pod's
status; the API server cannot change a static pod, so a mirror pod deleted by someone is made again, and
one left from a manifest that is gone (or changed) is deleted. MirrorPods does that, level-triggered from
the static pods and the informer's mirror pods.

Changes are noticed by a stat of the manifests every second (names, sizes, modification times: cheap),
and every fileCheckFrequency the files are read again regardless.
"""
from __future__ import annotations

import copy
import datetime
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pykubelet.api.fields import FieldError
from pykubelet.api.informer import ADDED, DELETED, Handler, key_of
from pykubelet.api.podmodel import parse_pod, pull_policy
from pykubelet.errors import InvalidArgumentError
from pykubelet.pods.podspec import CONFIG_MIRROR, CONFIG_SOURCE

log = logging.getLogger(__name__)

CONFIG_HASH = "kubernetes.io/config.hash"
CONFIG_SEEN = "kubernetes.io/config.seen"
SOURCE_FILE = "file"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STAT_INTERVAL = 1.0


class ManifestError(InvalidArgumentError):
    """A static pod manifest the kubelet cannot run; the message names the file and the field."""


def is_mirror(pod: Any) -> bool:
    """True for a mirror pod (a lightkube model or a dict)."""
    meta = pod["metadata"] if isinstance(pod, dict) else pod.metadata
    annotations = (meta.get("annotations") if isinstance(meta, dict) else meta.annotations) or {}
    return CONFIG_MIRROR in annotations


def is_static(pod: dict) -> bool:
    return pod["metadata"].get("annotations", {}).get(CONFIG_SOURCE) == SOURCE_FILE


def _default_container(c: dict) -> None:
    c.setdefault("imagePullPolicy", pull_policy(c.get("image", "")))
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("resources", {})
    res = c["resources"]
    if res.get("limits"):  # requests default to the limits, as the API server's defaulting does
        res["requests"] = {**res["limits"], **res.get("requests", {})}
    for port in c.get("ports", []):
        port.setdefault("protocol", "TCP")


def apply_defaults(pod: dict) -> dict:
    """The API server's defaults for the fields the kubelet reads (in place; returns `pod`)."""
    pod["metadata"].setdefault("namespace", "default")
    spec = pod["spec"]
    for key, value in (("restartPolicy", "Always"), ("dnsPolicy", "ClusterFirst"),
                       ("terminationGracePeriodSeconds", 30), ("schedulerName", "default-scheduler"),
                       ("securityContext", {}), ("enableServiceLinks", True)):
        spec.setdefault(key, value)
    for c in spec.get("initContainers", []) + spec["containers"]:
        _default_container(c)
    return pod


def _dropped(given: Any, kept: Any, path: str) -> str | None:
    """The first field path of `given` that is not in `kept` (what the model did not know)."""
    if isinstance(given, dict) and isinstance(kept, dict):
        for key, value in given.items():
            if value is None:
                continue
            if key not in kept:
                return f"{path}.{key}"
            found = _dropped(value, kept[key], f"{path}.{key}")
            if found:
                return found
    elif isinstance(given, list) and isinstance(kept, list):
        for i, (a, b) in enumerate(zip(given, kept, strict=False)):
            found = _dropped(a, b, f"{path}[{i}]")
            if found:
                return found
    return None


def pod_uid(doc: dict, node_name: str, source: Path) -> str:
    """The kubelet's static pod UID: an md5 of the manifest's content, the node and the file."""
    h = hashlib.md5(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    h.update(f"host:{node_name}".encode())
    h.update(f"file:{source}".encode())
    return h.hexdigest()


def parse_manifest(text: str, source: Path, node_name: str) -> dict:
    """The static pod of one manifest's text (YAML or JSON: one Pod), defaulted, named and with its UID, as
    a dict; ManifestError names the file and the field."""
    import msgspec
    import yaml
    from lightkube.resources.core_v1 import Pod

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ManifestError(f"{source}: not YAML or JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ManifestError(f"{source}: not a Pod object")
    if doc.get("apiVersion") != "v1" or doc.get("kind") != "Pod":
        raise ManifestError(f"{source}: apiVersion/kind must be v1 Pod, got {doc.get('apiVersion')!r} "
                            f"{doc.get('kind')!r}")
    meta, spec = doc.get("metadata"), doc.get("spec")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise ManifestError(f"{source}: metadata.name: required")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise ManifestError(f"{source}: spec.containers: at least one container is required")
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            for key in ("name", "image"):
                if not isinstance(c, dict) or not isinstance(c.get(key), str) or not c[key]:
                    raise ManifestError(f"{source}: spec.{kind}[{i}].{key}: required")
    try:
        model = Pod.from_dict(doc)
    except (msgspec.ValidationError, TypeError, ValueError) as e:
        what, _, where = str(e).partition(" - at `$.")  # msgspec: "Expected `str`, got `int` - at `$.a.b`"
        raise ManifestError(f"{source}: {where.rstrip('`')}: {what}" if where else f"{source}: {what}") from e
    pod = model.to_dict()
    dropped = _dropped(doc, pod, "")
    if dropped:
        raise ManifestError(f"{source}: {dropped.lstrip('.')}: unknown field")
    uid = pod_uid(doc, node_name, source)
    meta = pod["metadata"]
    meta["name"] = f"{meta['name']}-{node_name}"
    meta["uid"] = uid
    meta["annotations"] = {**meta.get("annotations", {}), CONFIG_HASH: uid, CONFIG_SOURCE: SOURCE_FILE}
    apply_defaults(pod)
    pod["spec"]["nodeName"] = node_name
    # tolerate every NoExecute taint: a static pod is not evicted for node problems (as the kubelet's)
    pod["spec"]["tolerations"] = pod["spec"].get("tolerations", []) + [{"operator": "Exists",
                                                                        "effect": "NoExecute"}]
    pod["status"] = {"phase": "Pending"}
    try:  # what the pod workers will read of it, checked now: a bad field skips this file, not a sync
        parse_pod(pod)
    except FieldError as e:
        raise ManifestError(f"{source}: {e}") from e
    return pod


def manifest_files(path: Path) -> list[Path]:
    """The manifests at `path`: the file itself, or the directory's .yaml/.yml/.json files (not hidden ones,
    which editors leave), in name order."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix in MANIFEST_SUFFIXES)


def read_manifests(path: Path, node_name: str, errors: dict[Path, str] | None = None) -> dict[str, dict]:
    """The static pods of `path` by "namespace/name". A bad file is logged (once per distinct error, kept in
    `errors`) and skipped; of two files naming the same pod, the first by name wins and the other is
    reported."""
    pods: dict[str, dict] = {}
    seen_errors: dict[Path, str] = {}
    for file in manifest_files(path):
        try:
            pod = parse_manifest(file.read_text(), file, node_name)
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            if key in pods:
                raise ManifestError(f"{file}: metadata.name: pod {key} is already defined by another manifest")
        except (OSError, UnicodeDecodeError, ManifestError) as e:
            message = str(e)
            seen_errors[file] = message
            if errors is None or errors.get(file) != message:
                log.error("static pod manifest skipped: %s", message)
            continue
        pods[key] = pod
    if errors is not None:
        errors.clear()
        errors.update(seen_errors)
    return pods


def _signature(path: Path) -> tuple:
    """What changes when a manifest is written, added or removed (a stat of each, no read)."""
    out = []
    for file in manifest_files(path):
        try:
            st = file.stat()
        except OSError:
            continue
        out.append((file.name, st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class StaticPods:
    """The static pods of --pod-manifest-path, with an informer's interface (get, objects, add_handler,
    wait_synced, start, stop, join) over lightkube Pod models, so the pod workers take them as they take
    the API server's pods."""

    def __init__(self, path: Path, node_name: str, frequency: float = 20.0) -> None:
        self.path, self.node_name, self.frequency = path, node_name, frequency
        self._pods: dict[str, Any] = {}
        self._errors: dict[Path, str] = {}
        self._handlers: list[Handler] = []
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def get(self, key: str) -> Any | None:
        with self._lock:
            return self._pods.get(key)

    def objects(self) -> list[Any]:
        with self._lock:
            return list(self._pods.values())

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def errors(self) -> dict[Path, str]:
        """The manifests skipped on the last read, with why."""
        with self._lock:
            return dict(self._errors)

    def refresh(self) -> None:
        """Reads the manifests and tells the handlers what changed."""
        from lightkube.resources.core_v1 import Pod

        errors = dict(self._errors)
        fresh = read_manifests(self.path, self.node_name, errors)
        stamp = datetime.datetime.now(datetime.UTC).isoformat()
        with self._lock:
            old = self._pods
            new: dict[str, Any] = {}
            for key, pod in fresh.items():
                before = old.get(key)
                if before is not None and before.metadata.uid == pod["metadata"]["uid"]:
                    new[key] = before
                    continue
                pod["metadata"]["annotations"][CONFIG_SEEN] = stamp
                new[key] = Pod.from_dict(pod)
            self._pods, self._errors = new, errors
        for key, obj in old.items():
            if new.get(key) is not obj:
                self._notify(DELETED, obj, obj)
        for key, obj in new.items():
            if old.get(key) is not obj:
                log.info("static pod %s from %s (uid %s)", key, self.path, obj.metadata.uid)
                self._notify(ADDED, None, obj)
        self._synced.set()

    def _notify(self, kind: str, old: Any, new: Any) -> None:
        for handler in self._handlers:
            try:
                handler(kind, old, new)
            except Exception:
                log.exception("static pods: handler failed on %s %s", kind, key_of(new))

    def run(self) -> None:
        last_read = 0.0
        signature: tuple | None = None
        clock = 0.0
        while True:
            current = _signature(self.path)
            if current != signature or clock - last_read >= self.frequency:
                try:
                    self.refresh()
                except Exception:  # a bug in one read must not end the source
                    log.exception("static pods: reading %s failed", self.path)
                signature, last_read = current, clock
            interval = min(STAT_INTERVAL, self.frequency) if self.frequency > 0 else STAT_INTERVAL
            if self._stop.wait(interval):
                return
            clock += interval

    def start(self) -> StaticPods:
        self._thread = threading.Thread(target=self.run, name="static-pods", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True


# --- mirror pods ------------------------------------------------------------------------------------------

def mirror_pod(static: dict, node_uid: str) -> dict:
    """The mirror pod of a static pod: its metadata and spec, the mirror annotation, owned by the Node (the
    only owner NodeRestriction lets a node set); the API server gives it a UID of its own."""
    meta = static["metadata"]
    annotations = {k: v for k, v in meta.get("annotations", {}).items() if k != CONFIG_SEEN}
    annotations[CONFIG_MIRROR] = meta["annotations"][CONFIG_HASH]
    node = static["spec"]["nodeName"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": meta.get("labels", {}),
                         "annotations": annotations,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                              "controller": True}]},
            "spec": copy.deepcopy(static["spec"])}


class MirrorPods:
    """Keeps one mirror pod in the API server per static pod: made when missing or deleted, replaced when
    it belongs to another version of the manifest, deleted when its static pod is gone. `on_created(uid)`
    is called with the static pod's UID after its mirror is made (its status must be sent again)."""

    def __init__(self, client, node_name: str, static: StaticPods, api_pods, *,
                 on_created: Callable[[str], None] = lambda _uid: None) -> None:
        from pykubelet.api.workqueue import WorkQueue

        self.client, self.node_name, self.static, self.api_pods = client, node_name, static, api_pods
        self.on_created = on_created
        self.queue = WorkQueue(base_delay=0.5, max_delay=30.0)
        self._node_uid = ""
        static.add_handler(lambda _kind, _old, new: self.queue.add(key_of(new)))
        api_pods.add_handler(self._on_api_pod)

    def _on_api_pod(self, _kind: str, old: Any, new: Any) -> None:
        if is_mirror(new) or (old is not None and is_mirror(old)):
            self.queue.add(key_of(new))

    def node_uid(self) -> str:
        if not self._node_uid:
            from lightkube.resources.core_v1 import Node
            self._node_uid = self.client.get(Node, self.node_name).metadata.uid
        return self._node_uid

    def sync(self, key: str) -> None:
        """Makes the mirror pod of `key` match its static pod (or go with it)."""
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Pod

        static = self.static.get(key)
        mirror = self.api_pods.get(key)
        namespace, name = key.split("/", 1)
        if mirror is not None and not is_mirror(mirror):
            if static is not None:
                log.warning("static pod %s: an API pod of that name exists: no mirror pod", key)
            return
        want = static.metadata.annotations[CONFIG_HASH] if static is not None else None
        if mirror is not None:
            have = (mirror.metadata.annotations or {}).get(CONFIG_MIRROR)
            if have == want and mirror.metadata.deletionTimestamp is None:
                return
            # a mirror pod being deleted (gracefully, by someone) goes now: nothing of it runs to wait for
            why = "being deleted" if mirror.metadata.deletionTimestamp else (
                "manifest changed" if want else "manifest gone")
            try:
                self.client.delete(Pod, name, namespace=namespace, grace_period=0)
                log.info("mirror pod %s deleted (%s)", key, why)
            except ApiError as e:
                if e.status.code != 404:
                    raise
            if want is None:
                return
        if static is None:
            return
        body = mirror_pod(static.to_dict(), self.node_uid())
        try:
            self.client.create(Pod.from_dict(body), namespace=namespace)
        except ApiError as e:
            if e.status.code != 409:  # the old one is still being deleted: the informer brings us back
                raise
            return
        log.info("mirror pod %s created", key)
        self.on_created(static.metadata.uid)

    def resync(self) -> None:
        """Every static pod and every mirror pod the informer has (the orphans of a manifest removed while
        the kubelet was away)."""
        for obj in self.static.objects():
            self.queue.add(key_of(obj))
        for obj in self.api_pods.objects():
            if is_mirror(obj):
                self.queue.add(key_of(obj))

    def run(self, stop: threading.Event) -> None:
        while not (self.api_pods.wait_synced(0.5) and self.static.wait_synced(0.5)):
            if stop.is_set():
                return
        self.resync()
        worker = threading.Thread(target=self._work, name="mirror-pods", daemon=True)
        worker.start()
        while not stop.wait(60):
            self.resync()
        self.queue.shut_down()
        worker.join(timeout=10)

    def _work(self) -> None:
        from pykubelet.api.workqueue import ShutDown

        while True:
            try:
                key = str(self.queue.get())
            except ShutDown:
                return
            try:
                self.sync(key)
            except Exception as e:
                delay = self.queue.add_rate_limited(key)
                log.warning("mirror pod %s: %s; again in %.1f s", key, e, delay)
            else:
                self.queue.forget(key)
            finally:
                self.queue.done(key)

