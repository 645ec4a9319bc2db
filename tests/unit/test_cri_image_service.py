"""The ImageService servicer over a real gRPC channel: requests reach cri/images.py, its errors come back
with the status code a CRI client expects (cri/service/instrument.py's table, which the servicer imports)."""
from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from proto import api_pb2, api_pb2_grpc
from pyruntime.cri.images import ImageService
from pyruntime.cri.service.image import ImageServicer
from pyruntime.images.store import ImageStore


def test_image_service_over_grpc(tmp_path):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_ImageServiceServicer_to_server(ImageServicer(ImageService(ImageStore(tmp_path / "store"))),
                                                    server)
    server.add_insecure_port(f"unix://{tmp_path}/cri.sock")
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{tmp_path}/cri.sock") as channel:
            stub = api_pb2_grpc.ImageServiceStub(channel)
            assert stub.ListImages(api_pb2.ListImagesRequest()).images == []
            status = stub.ImageStatus(api_pb2.ImageStatusRequest(image=api_pb2.ImageSpec(image="busybox")))
            assert not status.HasField("image")
            stub.RemoveImage(api_pb2.RemoveImageRequest(image=api_pb2.ImageSpec(image="busybox")))
            assert stub.ImageFsInfo(api_pb2.ImageFsInfoRequest()).image_filesystems[0].inodes_used.value > 0
            with pytest.raises(grpc.RpcError) as err:
                stub.PullImage(api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image="")))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as err:
                stub.PullImage(api_pb2.PullImageRequest(image=api_pb2.ImageSpec(image="Not A Reference")))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        server.stop(None)
