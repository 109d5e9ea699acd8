"""Upload size limits enforced while the body streams in, never after it was read.

A request whose ``Content-Length`` already says it is too big is refused before one byte of its body is read;
a body without one (chunked) is cut off by ``LimitedUploadHandler`` as soon as a file passes its limit.
"""

from __future__ import annotations

from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest

FORM_OVERHEAD_BYTES = 64 * 1024  # multipart boundaries, the name field, the CSRF token


class UploadTooBig(Exception):
    def __init__(self, limit: int):
        super().__init__(f"The upload is too big: at most {limit // (1024 * 1024)} MB per file are accepted.")


class LimitedUploadHandler(FileUploadHandler):
    """Counts each file's bytes as they arrive and stops the upload when one passes ``limit``."""

    def __init__(self, request: HttpRequest, limit: int):
        super().__init__(request)
        self.limit = limit
        self.received = 0
        self.exceeded = False

    def new_file(self, *args, **kwargs) -> None:
        self.received = 0
        super().new_file(*args, **kwargs)

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > self.limit:
            self.exceeded = True
            raise StopUpload(connection_reset=True)
        return raw_data  # the next handlers store it

    def file_complete(self, file_size: int) -> None:
        return None


def limit_upload(request: HttpRequest, *, per_file: int, files: int) -> LimitedUploadHandler:
    """Refuse by Content-Length, then install the streaming limit. Call before touching ``request.POST``.

    Raises:
        UploadTooBig: the declared length is over ``files * per_file`` (+ form overhead).
    """
    declared = request.META.get("CONTENT_LENGTH")
    if declared and declared.isdigit() and int(declared) > files * per_file + FORM_OVERHEAD_BYTES:
        raise UploadTooBig(per_file)
    handler = LimitedUploadHandler(request, per_file)
    request.upload_handlers.insert(0, handler)
    return handler
