"""Endpoints other servers have and trexo does not (yet): each answers 501 in its dialect's
error shape, saying what is missing and what to use instead, instead of the 404 a wrong URL
gets (which reads as if the client had the wrong host).
"""

from __future__ import annotations

from typing import Final, NoReturn

from quart_trio import QuartTrio

from trexo.api.errors import ApiError

UNSUPPORTED: Final[dict[str, str]] = {
    "/v1/embeddings": "trexo does not serve embeddings yet",
    "/v1/images/generations": "trexo does not generate images",
    "/v1/audio/transcriptions": "trexo does not transcribe audio",
    "/v1/audio/speech": "trexo does not synthesize speech",
    "/api/embed": "trexo does not serve embeddings yet",
    "/api/embeddings": "trexo does not serve embeddings yet",
    "/api/pull": (
        "trexo does not pull models through the Ollama API: download one with "
        "`trexo download REPO` or place it with POST /instances (the node fetches it)"
    ),
    "/api/push": "trexo does not push models",
    "/api/create": "trexo does not create models from a Modelfile",
    "/api/copy": "trexo does not copy models",
    "/api/delete": "trexo does not delete models through the Ollama API: DELETE /instances/ID",
}
"""Path -> why it is not served (and what to do instead)."""
METHODS: Final = ("GET", "POST", "DELETE", "PUT")


def register_unsupported(app: QuartTrio) -> None:
    for path, why in UNSUPPORTED.items():

        async def refuse(why: str = why, path: str = path) -> NoReturn:
            raise ApiError(501, f"{why} ({path})", code="unsupported_endpoint")

        app.add_url_rule(path, f"unsupported{path}", refuse, methods=list(METHODS))
