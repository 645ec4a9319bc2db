#!/usr/bin/env python3
"""The provisioning entry point `make cluster` runs (and the Vagrant lab will): `up` brings up a stock control
plane and NODES pynode nodes on this machine, `down` removes every trace, `status` says what runs.

Run it with the project's Python (`make cluster` passes .venv/bin/python). In a checkout, the test registry
with the test images (tests/kit) is part of the cluster; `--no-test-images` leaves pulls to the real
registries.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
if (CHECKOUT / "tests" / "kit").is_dir():
    sys.path.insert(0, str(CHECKOUT))  # the test image kit; pynode_cluster itself is installed

from pynode_cluster import cluster  # noqa: E402  (after the checkout is on the path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up", help="bring the cluster up (a running one is left as it is)")
    start.add_argument("--nodes", type=int, default=int(os.environ.get("NODES", "1")))
    start.add_argument("--kubelet", default=os.environ.get("KUBELET", "pykubelet"),
                       help="pykubelet or kubelet (the stock one)")
    start.add_argument("--runtime", default=os.environ.get("RUNTIME", "pyruntime-cri"),
                       help="pyruntime-cri or containerd")
    start.add_argument("--kubeadm", action="store_true", default=os.environ.get("KUBEADM", "") not in ("", "0"),
                       help="kubeadm init and join make the cluster, on nodes of pykubelet and pyruntime-cri")
    start.add_argument("--no-test-images", dest="test_images", action="store_false",
                       help="no test registry: images come from the real registries")
    sub.add_parser("down", help="remove every trace of the cluster")
    sub.add_parser("status", help="the kubeconfig and the logs of a running cluster")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        p.error("the cluster makes network namespaces, links and cgroups: run it as root")
    try:
        if args.command == "up":
            images = None
            if args.test_images and (CHECKOUT / "tests" / "kit").is_dir():
                from tests.kit import cluster_registry
                images = cluster_registry.start_kubeadm if args.kubeadm else cluster_registry.start
            return cluster.up(args.nodes, args.kubelet, args.runtime, images, kubeadm=args.kubeadm)
        if args.command == "down":
            return cluster.down()
        if not cluster.running():
            print("no cluster is running")
            return 1
        print(cluster.describe())
        return 0
    except cluster.ClusterError as e:
        print(f"cluster {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
