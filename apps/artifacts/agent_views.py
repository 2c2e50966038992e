"""The control plane's store, served to agents: node credential, ``Range`` for resumed transfers."""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterator
from pathlib import Path

from django.http import FileResponse, HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.http import require_GET

from apps.artifacts.models import Artifact, ArtifactState
from apps.nodes.models import Node, digest
from modelforge.errors import ApiError

RANGE = re.compile(r"^bytes=(\d+)-$")
CHUNK = 1 << 20


def _node(request: HttpRequest) -> Node:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    wanted = digest(presented.strip()) if scheme.lower() == "bearer" and presented.strip() else ""
    node = Node.objects.filter(credential_hash=wanted).first() if wanted else None
    if node is None or not hmac.compare_digest(node.credential_hash, wanted):
        raise ApiError(
            "NODE_CREDENTIAL_INVALID",
            "A node credential is required to fetch artifact files.",
            401,
            {"WWW-Authenticate": 'Bearer realm="modelforge-agent"'},
        )
    return node


@require_GET
def artifact_file(request: HttpRequest, pk: int, path: str) -> HttpResponseBase:
    _node(request)
    artifact = Artifact.objects.filter(pk=pk, state=ArtifactState.READY).first()
    if artifact is None or path not in {f["path"] for f in artifact.files}:
        raise ApiError("NOT_FOUND", "No such file of a ready artifact.", 404)
    file_path = Path(artifact.store_path) / path
    size = file_path.stat().st_size
    match = RANGE.match(request.headers.get("Range", ""))
    if not match:
        return FileResponse(file_path.open("rb"), content_type="application/octet-stream")
    start = int(match.group(1))
    if start >= size:
        return HttpResponse(status=416, headers={"Content-Range": f"bytes */{size}"})

    def chunks() -> Iterator[bytes]:
        with file_path.open("rb") as reader:
            reader.seek(start)
            yield from iter(lambda: reader.read(CHUNK), b"")

    response = StreamingHttpResponse(chunks(), status=206, content_type="application/octet-stream")
    response["Content-Length"] = str(size - start)
    response["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
    return response
