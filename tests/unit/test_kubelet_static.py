"""pykubelet's static pods and admission, the parts that need no runtime: manifest parsing, the defaults,
the UID, the file source's change events, the mirror pod's shape, the pod sources' view, and admission
arithmetic (max-pods, cpu/memory against allocatable, node affinity, host ports)."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from pykubelet.api.podmodel import ObjectMeta, parse_pod
from pykubelet.pods import admission, podspec, static
from pykubelet.pods.sources import PodSources

NODE = "node-a"
WEB = """apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: httpd
    image: busybox:1.36
    command: [httpd, -f, -p, "80"]
    ports: [{containerPort: 80}]
    resources: {limits: {cpu: 250m, memory: 64Mi}}
"""


def parse(text: str = WEB, source: Path = Path("/etc/kubernetes/manifests/web.yaml"), node: str = NODE) -> dict:
    return static.parse_manifest(text, source, node)


def test_manifest_defaults_name_and_uid():
    pod = parse()
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "web-node-a" and meta["namespace"] == "default"
    assert meta["annotations"][static.CONFIG_HASH] == meta["uid"] and len(meta["uid"]) == 32
    assert meta["annotations"][podspec.CONFIG_SOURCE] == "file"
    assert spec["nodeName"] == NODE and spec["restartPolicy"] == "Always" and spec["dnsPolicy"] == "ClusterFirst"
    assert spec["terminationGracePeriodSeconds"] == 30
    c = spec["containers"][0]
    assert c["imagePullPolicy"] == "IfNotPresent" and c["terminationMessagePath"] == "/dev/termination-log"
    assert c["ports"][0]["protocol"] == "TCP"
    assert c["resources"]["requests"] == {"cpu": "250m", "memory": "64Mi"}  # requests default to limits
    assert {"operator": "Exists", "effect": "NoExecute"} in spec["tolerations"]
    assert static.is_static(pod)


def test_uid_stable_for_same_content_and_new_for_a_change():
    uid = parse()["metadata"]["uid"]
    assert parse(WEB.replace("labels: {app: web}", "labels:\n    app: web"))["metadata"]["uid"] == uid  # same object
    assert parse(WEB.replace("1.36", "1.37"))["metadata"]["uid"] != uid
    assert parse(node="node-b")["metadata"]["uid"] != uid
    assert parse(source=Path("/other/web.yaml"))["metadata"]["uid"] != uid
    as_json = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                          "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    pod = parse(as_json)
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "Always"  # no tag: latest


@pytest.mark.parametrize("text, where", [
    ("- a list", "not a Pod object"),
    ("apiVersion: v1\nkind: Service\nmetadata: {name: x}\n", "apiVersion/kind"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {}\nspec: {containers: [{name: c, image: i}]}\n", "metadata.name"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: []}\n", "spec.containers"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c}]}\n", "spec.containers[0].image"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: i, imag: j}]}\n",
     "spec.containers[0].imag: unknown field"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: i, ports: [{containerPort: "
     "abc}]}]}\n", "spec.containers[0].ports[0].containerPort: Expected `int"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x\nspec: {}\n", "not YAML or JSON"),
    # what the typed pod refuses, as the pod workers would (the API server's validation, which no file has)
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {restartPolicy: Sometimes, containers: [{name: c, "
     "image: i}]}\n", 'spec.restartPolicy: unknown restart policy "Sometimes"'),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: i, ports: [{containerPort: "
     "0}]}]}\n", "spec.containers[0].ports[0].containerPort: 0 is out of range [1, 65535]"),
])
def test_bad_manifest_names_file_and_field(text, where):
    with pytest.raises(static.ManifestError) as e:
        parse(text, Path("/m/bad.yaml"))
    assert str(e.value).startswith("/m/bad.yaml: ") and where in str(e.value)


def test_read_manifests_skips_bad_files_once(tmp_path, caplog):
    (tmp_path / "web.yaml").write_text(WEB)
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / ".web.yaml.swp").write_text("junk")
    (tmp_path / "notes.txt").write_text("junk")
    errors: dict = {}
    with caplog.at_level(logging.ERROR):
        pods = static.read_manifests(tmp_path, NODE, errors)
        static.read_manifests(tmp_path, NODE, errors)
    assert list(pods) == ["default/web-node-a"]
    assert list(errors) == [tmp_path / "bad.json"]
    assert sum("bad.json" in r.message for r in caplog.records) == 1  # logged once, not at every read
    assert list(static.read_manifests(tmp_path / "web.yaml", NODE)) == ["default/web-node-a"]  # a single file
    assert static.read_manifests(tmp_path / "missing", NODE) == {}


def got(source, key: str) -> Any:
    pod = source.get(key)
    assert pod is not None, key
    return pod


def test_static_pods_source_events(tmp_path):
    (tmp_path / "web.yaml").write_text(WEB)
    source = static.StaticPods(tmp_path, NODE)
    seen: list[tuple[str, str]] = []
    source.add_handler(lambda kind, _old, new: seen.append((kind, new.metadata.uid)))
    source.refresh()
    assert source.has_synced()
    first = got(source, "default/web-node-a").metadata.uid
    assert seen == [("ADDED", first)]
    source.refresh()  # unchanged: no event
    assert len(seen) == 1
    (tmp_path / "web.yaml").write_text(WEB.replace("1.36", "1.37"))
    source.refresh()
    second = got(source, "default/web-node-a").metadata.uid
    assert seen[1:] == [("DELETED", first), ("ADDED", second)]
    (tmp_path / "web.yaml").unlink()
    source.refresh()
    assert seen[3:] == [("DELETED", second)] and source.objects() == []


def test_mirror_pod_shape():
    pod = parse()
    mirror = static.mirror_pod(pod, "node-uid-1")
    meta = mirror["metadata"]
    assert meta["name"] == "web-node-a" and "uid" not in meta
    assert meta["annotations"][podspec.CONFIG_MIRROR] == pod["metadata"]["uid"]
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1",
                                        "controller": True}]
    assert static.is_mirror(mirror) and static.is_mirror(Pod.from_dict(mirror)) and not static.is_mirror(pod)


class FakeInformer:
    def __init__(self, pods: list[dict]) -> None:
        self.pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": Pod.from_dict(p) for p in pods}
        self.handlers: list = []

    def get(self, key):
        return self.pods.get(key)

    def objects(self):
        return list(self.pods.values())

    def add_handler(self, h):
        self.handlers.append(h)

    def has_synced(self):
        return True

    def wait_synced(self, timeout=None):
        return True


def test_sources_hide_mirror_pods_behind_the_static_pod(tmp_path):
    (tmp_path / "web.yaml").write_text(WEB)
    statics = static.StaticPods(tmp_path, NODE)
    statics.refresh()
    mirror = static.mirror_pod(got(statics, "default/web-node-a").to_dict(), "n")
    mirror["metadata"]["uid"] = "mirror-uid"
    other = {"metadata": {"name": "api", "namespace": "default", "uid": "api-uid"},
             "spec": {"containers": [{"name": "c", "image": "i"}]}}
    api = FakeInformer([mirror, other])
    sources = PodSources(api, statics)
    seen = []
    sources.add_handler(lambda kind, _old, new: seen.append(new.metadata.name))
    for h in api.handlers:
        h("ADDED", None, api.pods["default/web-node-a"])
        h("ADDED", None, api.pods["default/api"])
    assert seen == ["api"]
    assert got(sources, "default/web-node-a").metadata.uid == got(statics, "default/web-node-a").metadata.uid
    assert sorted(p.metadata.name for p in sources.objects()) == ["api", "web-node-a"]
    assert PodSources(api, None).get("default/web-node-a") is None


# --- admission ---------------------------------------------------------------------------------------------

def apod(name: str, cpu: str | None = None, memory: str | None = None, **spec) -> dict:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": requests}}], **spec}}


ALLOC = {"cpu": "2", "memory": "1Gi", "pods": "3"}
LABELS = {"kubernetes.io/hostname": NODE, "disk": "ssd", "zone": "5"}


def check(pod: dict, others: list[dict], **kw) -> admission.Verdict:
    return admission.check(parse_pod(pod), [parse_pod(o) for o in others], allocatable=kw.pop("allocatable", ALLOC),
                           labels=LABELS, node_name=NODE, **kw)


def test_requests_sum_containers_and_take_the_largest_init():
    pod = apod("p", "500m", "100Mi")
    pod["spec"]["containers"].append({"name": "d", "image": "i", "resources": {"limits": {"cpu": "250m"}}})
    pod["spec"]["initContainers"] = [
        {"name": "i", "image": "i", "resources": {"requests": {"cpu": "1", "memory": "1Mi"}}},
        {"name": "s", "image": "i", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}]
    pod["spec"]["overhead"] = {"memory": "10Mi"}
    req = admission.pod_requests(parse_pod(pod))
    # as the scheduler counts it (PodRequests): the init container runs before the sidecar starts
    assert req["cpu"] == admission.Decimal("1")  # max(0.5 + 0.25 + 0.1 sidecar, 1 init)
    assert req["memory"] == 110 * 2**20
    pod["spec"]["initContainers"].reverse()  # the sidecar started first runs beside the init container
    assert admission.pod_requests(parse_pod(pod))["cpu"] == admission.Decimal("1.1")


def test_out_of_pods_cpu_memory():
    running = [apod("a", "1500m", "512Mi"), apod("b")]
    assert check(apod("new", "500m", "512Mi"), running).admit
    v = check(apod("new", "600m"), running)
    assert (v.admit, v.reason) == (False, "OutOfcpu")
    assert v.message == "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"
    v = check(apod("new", memory="600Mi"), running)
    assert v.reason == "OutOfmemory" and f"requested: {600 * 2**20}, used: {512 * 2**20}" in v.message
    v = check(apod("new"), running + [apod("c")])
    assert v.reason == "OutOfpods" and v.message.endswith("requested: 1, used: 3, capacity: 3")


def test_node_selector_and_affinity():
    assert check(apod("p", nodeSelector={"disk": "ssd"}), []).admit
    v = check(apod("p", nodeSelector={"disk": "hdd"}), [])
    assert (v.reason, v.message) == ("NodeAffinity", f"Predicate NodeAffinity failed: {admission.AFFINITY_DESC}")

    def affinity(*terms):
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}
    expr = [{"key": "zone", "operator": "Gt", "values": ["3"]}, {"key": "gpu", "operator": "DoesNotExist"}]
    assert check(apod("p", affinity=affinity({"matchExpressions": expr})), []).admit
    no = {"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["ssd"]}]}
    assert not check(apod("p", affinity=affinity(no)), []).admit
    fields = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    assert check(apod("p", affinity=affinity(no, fields)), []).admit  # terms are ORed
    assert not check(apod("p", affinity=affinity({})), []).admit


def test_host_ports_and_runtime_class_and_os():
    def with_port(name, port, ip=None, protocol="TCP"):
        pod = apod(name)
        pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": port, "protocol": protocol,
                                                  **({"hostIP": ip} if ip else {})}]
        return pod
    others = [with_port("a", 8080, "127.0.0.1")]
    assert check(with_port("b", 8080, "127.0.0.2"), others).admit
    assert check(with_port("b", 8080, protocol="UDP"), others).admit
    v = check(with_port("b", 8080), others)
    assert v.reason == "NodePorts" and "free ports" in v.message
    v = check(apod("p", runtimeClassName="gvisor"), [])
    assert (v.reason, v.message) == ("UnknownRuntimeClass", 'RuntimeClass "gvisor" not found')
    assert check(apod("p", runtimeClassName="gvisor"), [], runtime_class_known=lambda n: n == "gvisor").admit
    assert check(apod("p", os={"name": "windows"}), []).reason == "PodOSNotSupported"


def test_admission_is_stable_and_counts_pods_already_on_the_node():
    pods = [apod("running", "1500m"), apod("new1", "400m"), apod("new2", "400m")]
    on_node = {"uid-running"}
    adm = admission.Admission(NODE, pods=lambda: [parse_pod(p) for p in pods], on_node=lambda: on_node,
                              allocatable=lambda: ALLOC, labels=lambda: LABELS)
    # a new pod weighed before the running pod's own sync still sees the running pod's requests
    assert adm.admit(parse_pod(pods[1]), has_runtime_state=False).admit
    v = adm.admit(parse_pod(pods[2]), has_runtime_state=False)
    assert v.reason == "OutOfcpu" and "used: 1900" in v.message
    assert adm.admit(parse_pod(pods[0]), has_runtime_state=True).admit  # already on the node: never rejected
    assert adm.admit(parse_pod(pods[2]), has_runtime_state=False) == v  # a decision is final
    status = admission.rejected_status(parse_pod(pods[2]), v)
    assert status["phase"] == "Failed" and status["reason"] == "OutOfcpu"
    assert status["message"].startswith("Pod was rejected: Node didn't have enough resource: cpu")
    adm.forget("uid-new2")
    pods[0]["status"] = {"phase": "Succeeded"}  # a finished pod no longer counts
    assert adm.admit(parse_pod(pods[2]), has_runtime_state=False).admit


def test_cached_keeps_the_last_value_when_a_read_fails():
    answers = iter([{"a": "1"}])

    def read():
        return next(answers)
    cached = admission.Cached(read, ttl=0)
    assert cached() == {"a": "1"}
    assert cached() == {"a": "1"}


# --- standalone mode: no API client --------------------------------------------------------------------------

def test_status_manager_and_events_without_api_client(caplog):
    from pykubelet.events import WARNING, EventRecorder, pod_ref
    from pykubelet.pods.status import StatusManager

    statuses = StatusManager(None)
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    meta = ObjectMeta("web", "default", "u1", generation=1)
    assert statuses.set_pod_status(meta, dict(status))
    assert not statuses.set_pod_status(meta, dict(status, conditions=[{"type": "Ready", "status": "True"}]))
    assert statuses.last("u1")["phase"] == "Running"
    with caplog.at_level(logging.INFO):
        EventRecorder(None, NODE).event(pod_ref(parse_pod(parse())), WARNING, "OutOfcpu", "no room")
    assert any("OutOfcpu" in r.message and "web-node-a" in r.message for r in caplog.records)
