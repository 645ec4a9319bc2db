"""The CRI streaming server (exec, attach, port-forward), what k8s.io/cri-streaming is to the kubelet's
runtimes. The daemon uses two names:

- `server.StreamingServer(address, backend)`: start()/stop(); get_exec/get_attach/get_port_forward turn
  the CRI request into the response whose URL (one-shot token, 1 minute) the client then opens;
- `backend.RuntimeStreamBackend(launcher, layout, sandbox_netns, kernel)`: the StreamBackend over the
  launcher's exec helper, the supervisors' attach sockets and the pods' network namespaces.

Nothing is imported here: the daemon's start-up pays for h11/wsproto only when it starts the server.
"""
