"""The kubelet's HTTPS server (:10250) and its parts, one job per module: tls (serving certificate and
client-certificate verification), authn (who asks), authz (may they: SubjectAccessReview), logs (CRI log
files to `kubectl logs`), streaming (exec/attach/port-forward proxied to the runtime's streaming server),
stats (/stats/summary), metrics (/metrics), app (the HTTP server and its routes: KubeletServer)."""
