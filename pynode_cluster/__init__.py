"""The node's assembly: one node on this machine without an API server (`pynode run`, standalone.py), and a stock
control plane and pynode nodes on one machine (`make cluster`) or on the lab's VMs (vagrant/), every node wired
by node.py.

The same code starts the cluster and the lab: vagrant/provision/cluster.py is the cluster's command line. Its
job is to get a user from a bare machine to `kubectl create deployment` on our node without kubeadm, a
container runtime for nodes, or VMs, and to take all of it away again. The test kit (tests/kit/controlplane.py)
starts its control plane from the same command lines and certificates, so the tests check what users run.
"""
