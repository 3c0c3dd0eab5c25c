"""Serves the dashboard (`trexo.dashboard`): the page at `/`, its files at `/dashboard/NAME`.
On the Ollama listener, `/` answers as Ollama does ("Ollama is running").

Its Content-Security-Policy locks the page to this origin: it runs only its own script and
talks only to the API that served it. Any other name is the API's usual JSON 404.
"""

from __future__ import annotations

from quart import Response, current_app, request
from quart_trio import QuartTrio
from werkzeug.exceptions import NotFound

from trexo.api.server import OLLAMA_PORT_KEY
from trexo.dashboard import INDEX, Asset, load_assets

OLLAMA_IS_RUNNING = "Ollama is running"
"""`GET /` on the Ollama listener, as Ollama answers it."""
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
ASSET_HEADERS = {
    # A node upgraded in place serves its new page at the next load.
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
}


def register_dashboard(app: QuartTrio) -> None:
    assets = load_assets()

    @app.get("/")
    async def dashboard_page() -> Response:
        if _on_ollama_port():
            # What Ollama answers there: clients and scripts probe it to see a server is up.
            return current_app.response_class(
                OLLAMA_IS_RUNNING, status=200, content_type="text/plain; charset=utf-8"
            )
        return asset_response(assets[INDEX])

    @app.get("/dashboard/<name>")
    async def dashboard_file(name: str) -> Response:
        asset = assets.get(name)
        if asset is None:
            raise NotFound()
        return asset_response(asset)


def _on_ollama_port() -> bool:
    """Whether this request came in on the Ollama listener (`--ollama-port`)."""
    port = current_app.config.get(OLLAMA_PORT_KEY)
    server = request.scope.get("server")
    return port is not None and server is not None and server[1] == port


def asset_response(asset: Asset) -> Response:
    return current_app.response_class(
        asset.body, status=200, headers=ASSET_HEADERS, content_type=asset.content_type
    )
