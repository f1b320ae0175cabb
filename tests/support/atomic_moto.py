"""moto's S3 server (`moto_server`) with conditional writes made atomic, as S3's are.

moto checks a PutObject's `If-None-Match` / `If-Match` (and a DeleteObject's `If-Match`) and then writes, in two
steps, on a threaded server with no lock between them: two requests released together can both pass the check,
so a create-if-absent race has two winners there, where S3 (and GCS) give exactly one. Here one lock holds each
conditional request's check and write together; everything else is moto's own server. Run as a script with
`moto_server`'s arguments.
"""

import functools
import threading

from moto.s3.responses import S3Response
from moto.server import main

_LOCK = threading.Lock()


def _atomic(method):
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with _LOCK:
            return method(self, *args, **kwargs)

    return locked


S3Response.put_object = _atomic(S3Response.put_object)
S3Response.delete_object = _atomic(S3Response.delete_object)

if __name__ == "__main__":
    main()
