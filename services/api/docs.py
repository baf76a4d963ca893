"""`/docs`: the OpenAPI document in Swagger UI, served from this process alone.

FastAPI's own docs page loads Swagger UI from a CDN, so opening it runs a third party's script
with the API's origin (and fails without internet access). Here the page and the script that
starts Swagger UI are ours, Swagger UI's files come from the `fastapi-offline` package, and a
Content-Security-Policy tells the browser to load nothing from anywhere else. Like
`/openapi.json`, the page needs no token: it shows the API's shape, which holds no secret;
trying a request in it asks for a token ("Authorize").
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, Response
from starlette.exceptions import HTTPException

ASSETS = Path(str(importlib.resources.files("fastapi_offline") / "static"))  # an installed dir
# the files the page uses, by the name it asks for them with, and their media type
FILES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
}
# Nothing from another origin; Swagger UI sets inline styles and draws icons from data: URLs.
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff"}

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Wingsmith API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
<link rel="icon" href="/docs/assets/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/start.js"></script>
</body>
</html>
"""

# No validator badge: Swagger UI would fetch it from validator.swagger.io.
START = """window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  layout: "BaseLayout",
});
"""

router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def page() -> HTMLResponse:
    return HTMLResponse(PAGE, headers=HEADERS)


@router.get("/docs/start.js")
async def start() -> Response:
    return Response(START, media_type="text/javascript", headers=HEADERS)


@router.get("/docs/assets/{name}")
async def asset(name: str) -> FileResponse:
    """One of Swagger UI's files; they change only with the package, so browsers keep them."""
    if name not in FILES:
        raise HTTPException(404, f"no asset {name!r}")
    cached = {"Cache-Control": "public, max-age=86400"}
    return FileResponse(ASSETS / name, media_type=FILES[name], headers=HEADERS | cached)
