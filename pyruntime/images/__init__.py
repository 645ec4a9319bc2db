"""Images: references, the distribution client, verified content, safe layer unpacking, snapshots.

The entry point is `pyruntime.images.store.ImageStore`, which the CRI image service and `pyruntime image` both
use; it composes the parts containerd splits an image service into: content.py (blobs by digest), metadata.py
(the images database, reference resolution), pull.py (orchestration, progress events), archive.py
(import/export), gc.py (mark and sweep), snapshots.py (records that return the mounts to make) and mount.py
(the helper that makes them). Settings are constructor parameters; only the CLI reads environment variables.
Submodules are imported on demand so that using one (say, reference parsing) does not load the HTTP stack.
"""
