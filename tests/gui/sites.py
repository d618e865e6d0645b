"""Small sites for the browser tests: pages made of whatever a test puts in them."""

from __future__ import annotations

from collections.abc import Callable

from envs.gui.tasks import PlanStep, Request, Response, Site, not_found, page


class PagesSite(Site):
    """Serves ``pages[path]`` (a Response or a function of the request); records requests."""

    name = "pages"

    def __init__(self, pages: dict[str, Response | Callable[[Request], Response]]) -> None:
        super().__init__()
        self.pages = pages
        self.requests: list[Request] = []

    @property
    def instruction(self) -> str:
        return "test site"

    @property
    def plan(self) -> list[PlanStep]:
        return []

    def respond(self, request: Request) -> Response:
        self.requests.append(request)
        got = self.pages.get(request.path)
        if got is None:
            return not_found(request.path)
        return got(request) if callable(got) else got


def html(body: str, title: str = "t") -> Response:
    return page(title, body)
