"""The CRI ImageService over gRPC: protobuf in, a call of cri/images.py, protobuf out; errors are mapped by
instrument.py."""
from __future__ import annotations

from typing import Any

from proto import api_pb2, api_pb2_grpc
from pyruntime.cri.images import ImageService
from pyruntime.cri.service.instrument import instrumented


@instrumented("ImageService")
class ImageServicer(api_pb2_grpc.ImageServiceServicer):
    def __init__(self, images: ImageService) -> None:
        self.images = images

    def ListImages(self, request: Any, context: Any) -> Any:
        f = request.filter if request.HasField("filter") else None
        return api_pb2.ListImagesResponse(images=self.images.list_images(f))

    def ImageStatus(self, request: Any, context: Any) -> Any:
        return self.images.image_status(request.image, request.verbose)

    def PullImage(self, request: Any, context: Any) -> Any:
        auth = request.auth if request.HasField("auth") else None
        return api_pb2.PullImageResponse(image_ref=self.images.pull_image(request.image, auth))

    def RemoveImage(self, request: Any, context: Any) -> Any:
        self.images.remove_image(request.image)
        return api_pb2.RemoveImageResponse()

    def ImageFsInfo(self, request: Any, context: Any) -> Any:
        return self.images.fs_info()
