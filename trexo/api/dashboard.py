"""Serves the dashboard (`trexo.dashboard`): the page at `/`, its files at `/dashboard/NAME`.

Its Content-Security-Policy locks the page to this origin: it runs only its own script and
talks only to the API that served it. Any other name is the API's usual JSON 404.
"""

from __future__ import annotations

from quart import Response, current_app
from quart_trio import QuartTrio
from werkzeug.exceptions import NotFound

from trexo.dashboard import INDEX, Asset, load_assets

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
        return asset_response(assets[INDEX])

    @app.get("/dashboard/<name>")
    async def dashboard_file(name: str) -> Response:
        asset = assets.get(name)
        if asset is None:
            raise NotFound()
        return asset_response(asset)


def asset_response(asset: Asset) -> Response:
    return current_app.response_class(
        asset.body, status=200, headers=ASSET_HEADERS, content_type=asset.content_type
    )
