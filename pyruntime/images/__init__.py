"""Images: references, the distribution client, verified content, safe layer unpacking, overlay snapshots.

The entry point is `pyruntime.images.store.ImageStore`; the CRI image service and `pyruntime image` both use it.
Submodules are imported on demand so that using one (say, reference parsing) does not load the HTTP stack.
"""
