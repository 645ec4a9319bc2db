"""pyruntime-cri: a CRI v1 server (RuntimeService and ImageService) over pyruntime's library, the image
store and CNI plugins run as executables. See model.py for what it keeps on disk and where."""
