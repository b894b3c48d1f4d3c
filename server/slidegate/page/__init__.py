"""The debug port's view of who is limited: ``GET /limited`` (JSON: slidegate.limited_view) and ``GET
/limited/page``, a page (``limited.html``, shipped inside this package: no build step, nothing fetched from
elsewhere) that reads it every few seconds and draws each rule's decisions, over-limit rate and top callers."""

from __future__ import annotations

from importlib.resources import files

from aiohttp import web

from slidegate.limited_view import LimitedView

PAGE = "limited.html"


def page_text() -> str:
    """The page's HTML, its script and style inside."""
    return files(__package__).joinpath(PAGE).read_text(encoding="utf-8")


def routes(view: LimitedView) -> list[web.RouteDef]:
    """The routes of ``view`` for the debug port's application."""
    page = page_text()

    async def limited(request: web.Request) -> web.Response:
        try:
            top = int(request.query.get("top", "10"))
        except ValueError:
            return web.json_response({"error": "top must be a whole number"}, status=400)
        if top < 1:
            return web.json_response({"error": "top must be at least 1"}, status=400)
        return web.json_response(await view.view(top))

    async def shown(_: web.Request) -> web.Response:
        # the page draws request values with textContent only; the policy keeps it to its own script and data
        return web.Response(text=page, content_type="text/html", headers={
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                       "connect-src 'self'; img-src data:"})

    return [web.get("/limited", limited), web.get("/limited/page", shown)]
