"""The gRPC edge of pyruntime-cri: servicers that turn protobuf requests into calls of the domain modules
and back, and the one table that turns pyruntime's error kinds into gRPC status codes. The only package
(with cri/main.py) that imports grpc."""
