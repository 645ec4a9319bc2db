"""The kubelet's certificates from the cluster: TLS bootstrap of the client certificate, its rotation, and
the serving certificate through a CSR (serverTLSBootstrap), as k8s.io/kubernetes' pkg/kubelet/certificate
and client-go's util/certificate do them.

Threat model:
- The private keys never leave the node. Each is made here (ECDSA P-256), only its public half goes out in
  a CertificateSigningRequest, and the signed certificate comes back; the key is written 0600 with the
  certificate into one pem file under --cert-dir (0700), whatever the umask, and is never logged.
- A bootstrap token (the --bootstrap-kubeconfig's credential, group system:bootstrappers) allows only
  what kubeadm's bindings give that group: create a CSR and read it back (system:node-bootstrapper), and
  have a kubernetes.io/kube-apiserver-client-kubelet CSR auto-approved (the nodeclient ClusterRole). It
  never acts as a node: everything else goes through the certificate it obtains. Whoever holds the token
  can get a client certificate for any node name, which is why kubeadm's tokens expire; the kubelet keeps
  no copy of it beyond the file it was given.
- A node's own certificate (system:node:NAME) can renew itself (selfnodeclient) but not name another
  node: the CSR's subject must be its own, or the approver refuses it.
- Serving certificates (kubernetes.io/kubelet-serving) are not auto-approved by the stock controller
  manager: an admin or an approver that checks the node's addresses against the SANs signs them, since
  a serving certificate with a forged IP lets a node pose as another to the API server.

policy is the pure part (what to request, when to rotate, whether a certificate still serves); store
writes the pem files; csr talks to the certificates API; manager runs the bootstrap and the rotations.
"""
