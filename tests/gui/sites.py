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


def bad_actions(ids: dict[str, int | None]) -> list[tuple[str, str]]:
    """Replies that must become error observations on the form task's first page (``ids``:
    element id by name), each with what its error says; both backends' tests play them."""
    return [
        ("I give up", "invalid action: no action found"),
        ("click(999)", "there is no element [999]"),
        ("click(x=5000, y=10)", "outside the screenshot (800 x 600 pixels)"),
        ('press("NoSuchKey")', "failed"),
        (f'select({ids["Full name"]}, "x")', "is not a drop-down"),
        (f'select({ids["Country"]}, "Atlantis")', "no option 'Atlantis'; the options are"),
        (f'type({ids["Send"]}, "x")', "failed"),
        ("back()", "there is no earlier page"),
    ]
