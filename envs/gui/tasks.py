"""The GUI tasks of our own: small websites built per seed, with programmatic checkers.

    site = LoginSite(rng)               # content drawn from rng: names, passwords, products
    site.instruction                    # 'Log in as "mira.okafor" with the password "k7vq2p".'
    site.respond(request)               # the site's server, called for every page request
    site.reward, site.done              # what the checker saw (set by respond)
    site.credit                         # the best fraction of the checker's conditions met so far
    site.plan                           # the oracle's steps, by role and name (scripted policy)

A site is served at ``ORIGIN`` by the browser session (Playwright's request routing answers
every request from ``respond``; nothing listens on a socket), so a task needs no files and
no server. Pages pin their font (DejaVu Sans, Debian's ``fonts-dejavu-core``) and have no
animation, so the same seed renders the same screenshot.

    login    type the username, type the password, click "Sign in"      (3 actions)
    search   type a query, click "Search", open the named result         (3 actions)
    form     type a name and an email, pick a country, maybe tick the
             newsletter box, click "Send"                                (4-5 actions)
    cart     open a product, pick the quantity, "Add to cart", "Check out" (4 actions)
    settings open "Settings", pick a language and a time zone, maybe tick
             "Email alerts", click "Save"                                (4-5 actions)

Each instruction names the content that tells tasks apart (user and password, query and
target, the form's values, the product and quantity, the settings), so the default ``Env.task_key`` (the reset observation's text)
splits them by content (``agentrl/splits.py``).
"""

from __future__ import annotations

import html
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import numpy as np

ORIGIN = "http://task.agentrl"
"""The origin every task page is served from (never resolved: the session answers it)."""


FIRST = (
    "mira",
    "jon",
    "ana",
    "tomas",
    "lena",
    "ravi",
    "sofia",
    "kenji",
    "noor",
    "ivan",
    "zoe",
    "omar",
)
LAST = (
    "okafor",
    "lind",
    "silva",
    "novak",
    "berg",
    "rao",
    "costa",
    "sato",
    "haddad",
    "petrov",
    "kim",
    "diaz",
)
ADJ = (
    "red",
    "blue",
    "green",
    "small",
    "large",
    "quiet",
    "rapid",
    "wooden",
    "steel",
    "soft",
    "bright",
    "folding",
)
NOUN = (
    "lamp",
    "chair",
    "kettle",
    "backpack",
    "clock",
    "desk",
    "mug",
    "jacket",
    "speaker",
    "bicycle",
)
COUNTRIES = (
    "Argentina",
    "Canada",
    "Egypt",
    "France",
    "India",
    "Japan",
    "Kenya",
    "Norway",
    "Peru",
    "Vietnam",
)

LANGUAGES = (
    "Dansk",
    "Deutsch",
    "English",
    "Español",
    "Français",
    "Italiano",
    "Nederlands",
    "Norsk",
    "Polski",
    "Suomi",
)
TIME_ZONES = tuple(f"UTC{h:+d}" if h else "UTC" for h in range(-6, 10))

STYLE = (
    "body{font-family:'DejaVu Sans',sans-serif;font-size:16px;line-height:1.4;margin:24px;"
    "color:#111;background:#fff}input,select,button{font:inherit;margin:4px 0}"
    "label{display:block;margin-top:8px}.err{color:#b00}*{animation:none!important;"
    "transition:none!important;caret-color:transparent}"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    """What the browser asked the site for."""

    method: str
    path: str  # without the query string
    query: dict[str, str] = field(default_factory=dict)
    form: dict[str, str] = field(default_factory=dict)  # a POSTed form, decoded


@dataclass(frozen=True, kw_only=True, slots=True)
class Response:
    body: str | bytes
    status: int = 200
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # answer this late (tests of page-load timeouts)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanStep:
    """One oracle step, by what the agent sees: act on the element with this role and name."""

    verb: str  # click, type, select
    role: str
    name: str
    text: str = ""


def page(title: str, body: str) -> Response:
    """A task page: pinned font, no animation."""
    t = html.escape(title)
    doc = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{t}</title>"
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    )
    return Response(body=doc)


def not_found(path: str) -> Response:
    return Response(
        body=page("Not found", f"<h1>Not found</h1><p>{html.escape(path)}</p>").body, status=404
    )


class Site(ABC):
    """A task's website and checker; ``respond`` serves it and updates ``reward``/``done``.

    ``credit`` is partial credit: the largest fraction of the checker's conditions that one
    submission met (the username and the password of a login, the fields of a form, ...). The
    env pays it instead of 0 when asked to (``partial_credit=True``); success stays all or
    nothing."""

    name: str
    start_path = "/"

    def __init__(self) -> None:
        self.reward = 0.0
        self.done = False
        self.credit = 0.0

    def _grade(self, *conditions: bool) -> bool:
        """Record one submission's conditions in ``credit``; True if all hold."""
        self.credit = max(self.credit, sum(conditions) / len(conditions))
        return all(conditions)

    @property
    @abstractmethod
    def instruction(self) -> str:
        """What the agent is asked to do, naming the content that makes this task."""

    @property
    @abstractmethod
    def plan(self) -> list[PlanStep]:
        """The oracle's steps."""

    @abstractmethod
    def respond(self, request: Request) -> Response:
        """Serve one request (any path, any method); record success or failure."""

    async def on_start(self, evaluate: Callable[[str], Awaitable[Any]]) -> None:
        """After the start page loaded: run page code (``evaluate(js_function)``) to set up."""
        return None

    async def on_step(self, evaluate: Callable[[str], Awaitable[Any]]) -> None:
        """After each action: read page state (a site whose checker runs in the page)."""
        return None


def _pick(rng: np.random.Generator, items: tuple[str, ...], k: int | None = None) -> list[str]:
    idx = rng.choice(len(items), size=k or 1, replace=False)
    return [items[int(i)] for i in idx]


class LoginSite(Site):
    name = "login"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        first, last = _pick(rng, FIRST)[0], _pick(rng, LAST)[0]
        self.user = f"{first}.{last}"
        alphabet = "abcdefghjkmnpqrstuvwxyz23456789"
        self.password = "".join(alphabet[int(i)] for i in rng.integers(0, len(alphabet), 6))
        self.attempts = 0

    @property
    def instruction(self) -> str:
        return f'Log in as "{self.user}" with the password "{self.password}".'

    @property
    def plan(self) -> list[PlanStep]:
        return [
            PlanStep(verb="type", role="textbox", name="Username", text=self.user),
            PlanStep(verb="type", role="textbox", name="Password", text=self.password),
            PlanStep(verb="click", role="button", name="Sign in"),
        ]

    def _form(self, error: str = "") -> Response:
        err = f"<p class='err' role='alert'>{html.escape(error)}</p>" if error else ""
        return page(
            "Sign in",
            "<h1>Sign in</h1>" + err + "<form method='post' action='/login'>"
            "<label for='u'>Username</label><input id='u' name='username' autocomplete='off'>"
            "<label for='p'>Password</label><input id='p' name='password' type='password'>"
            "<label><input type='checkbox' name='remember'> Remember me</label>"
            "<button type='submit'>Sign in</button></form>"
            "<p><a href='/forgot'>Forgot password?</a> <a href='/register'>Create an account</a></p>",
        )

    def respond(self, request: Request) -> Response:
        if request.path == "/":
            return self._form()
        if request.path == "/login" and request.method == "POST":
            self.attempts += 1
            if self._grade(
                request.form.get("username") == self.user,
                request.form.get("password") == self.password,
            ):
                self.reward, self.done = 1.0, True
                return page(
                    "Welcome",
                    f"<h1>Welcome, {html.escape(self.user)}</h1><p>You are signed in.</p>",
                )
            return self._form("Wrong username or password.")
        if request.path in ("/forgot", "/register"):
            return page(
                "Unavailable",
                "<h1>Unavailable</h1><p>This page is not available.</p><a href='/'>Back to sign in</a>",
            )
        return not_found(request.path)


class SearchSite(Site):
    name = "search"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.query = _pick(rng, NOUN)[0]
        adjs = _pick(rng, ADJ, 3)
        others = [n for n in NOUN if n != self.query]
        self.items = [f"{a} {self.query}" for a in adjs] + [
            f"{_pick(rng, ADJ)[0]} {n}" for n in _pick(rng, tuple(others), 5)
        ]
        self.prices = [int(p) for p in rng.integers(5, 300, len(self.items))]
        self.target = int(rng.integers(0, 3))  # one of the items matching the query

    @property
    def instruction(self) -> str:
        return (
            f'Search the shop for "{self.query}" and open the result "{self.items[self.target]}".'
        )

    @property
    def plan(self) -> list[PlanStep]:
        return [
            PlanStep(verb="type", role="searchbox", name="Search", text=self.query),
            PlanStep(verb="click", role="button", name="Search"),
            PlanStep(verb="click", role="link", name=self.items[self.target]),
        ]

    def _box(self, q: str = "") -> str:
        return (
            "<form method='get' action='/search' role='search'>"
            f"<input type='search' name='q' aria-label='Search' value='{html.escape(q, quote=True)}'>"
            "<button type='submit'>Search</button></form>"
        )

    def respond(self, request: Request) -> Response:
        if request.path == "/":
            return page(
                "Shop", "<h1>Shop</h1>" + self._box() + "<p>Find anything in our catalogue.</p>"
            )
        if request.path == "/search":
            q = request.query.get("q", "").strip().lower()
            hits = [i for i, t in enumerate(self.items) if q and q in t]
            rows = "".join(
                f"<li><a href='/item/{i}'>{html.escape(self.items[i])}</a> ${self.prices[i]}</li>"
                for i in hits
            )
            found = f"<ul>{rows}</ul>" if hits else "<p>No results.</p>"
            self._grade(self.target in hits, False)  # half: the search that finds the target
            return page("Search results", "<h1>Results</h1>" + self._box(q) + found)
        if request.path.startswith("/item/"):
            try:
                i = int(request.path.removeprefix("/item/"))
                title = self.items[i]
            except (ValueError, IndexError):
                return not_found(request.path)
            if i == self.target:
                self.credit = 1.0
                self.reward, self.done = 1.0, True
            return page(
                title,
                f"<h1>{html.escape(title)}</h1><p>Price: ${self.prices[i]}</p>"
                f"<a href='/search?q={quote(self.query)}'>Back to results</a>",
            )
        return not_found(request.path)


class FormSite(Site):
    name = "form"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        first, last = _pick(rng, FIRST)[0], _pick(rng, LAST)[0]
        self.full_name = f"{first.title()} {last.title()}"
        self.email = f"{first}{int(rng.integers(10, 99))}@example.org"
        self.country = _pick(rng, COUNTRIES)[0]
        self.newsletter = bool(rng.integers(0, 2))
        self.submitted: dict[str, str] | None = None

    @property
    def instruction(self) -> str:
        sub = "subscribe to" if self.newsletter else "do not subscribe to"
        return (
            f'Fill in the contact form with the name "{self.full_name}", the email '
            f'"{self.email}" and the country "{self.country}", {sub} the newsletter, and send it.'
        )

    @property
    def plan(self) -> list[PlanStep]:
        steps = [
            PlanStep(verb="type", role="textbox", name="Full name", text=self.full_name),
            PlanStep(verb="type", role="textbox", name="Email", text=self.email),
            PlanStep(verb="select", role="combobox", name="Country", text=self.country),
        ]
        if self.newsletter:
            steps.append(PlanStep(verb="click", role="checkbox", name="newsletter"))
        return [*steps, PlanStep(verb="click", role="button", name="Send")]

    def respond(self, request: Request) -> Response:
        if request.path == "/":
            options = "<option value=''>Choose...</option>" + "".join(
                f"<option>{c}</option>" for c in COUNTRIES
            )
            return page(
                "Contact",
                "<h1>Contact us</h1><form method='post' action='/submit'>"
                "<label for='n'>Full name</label><input id='n' name='name' autocomplete='off'>"
                "<label for='e'>Email</label><input id='e' name='email' autocomplete='off'>"
                f"<label for='c'>Country</label><select id='c' name='country'>{options}</select>"
                "<label><input type='checkbox' name='newsletter'> Send me the newsletter</label>"
                "<button type='submit'>Send</button></form>",
            )
        if request.path == "/submit" and request.method == "POST":
            f = request.form
            self.submitted = dict(f)
            ok = self._grade(
                f.get("name", "").strip() == self.full_name,
                f.get("email", "").strip() == self.email,
                f.get("country") == self.country,
                ("newsletter" in f) == self.newsletter,
            )
            self.reward, self.done = (1.0 if ok else 0.0), True
            return page("Thank you", "<h1>Thank you</h1><p>Your message was sent.</p>")
        return not_found(request.path)


class CartSite(Site):
    """Buy a named product in a given quantity: the order must hold exactly that, nothing else."""

    name = "cart"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        nouns = _pick(rng, NOUN, 6)
        self.items = [f"{_pick(rng, ADJ)[0]} {n}" for n in nouns]  # one noun each: names differ
        self.prices = [int(p) for p in rng.integers(5, 300, len(self.items))]
        self.target = int(rng.integers(0, len(self.items)))
        self.quantity = int(rng.integers(1, 6))
        self.cart: dict[int, int] = {}
        self.order: dict[int, int] | None = None

    @property
    def instruction(self) -> str:
        return (
            f'Buy {self.quantity} of the "{self.items[self.target]}": add them to the cart '
            "and check out."
        )

    @property
    def plan(self) -> list[PlanStep]:
        return [
            PlanStep(verb="click", role="link", name=self.items[self.target]),
            PlanStep(verb="select", role="combobox", name="Quantity", text=str(self.quantity)),
            PlanStep(verb="click", role="button", name="Add to cart"),
            PlanStep(verb="click", role="button", name="Check out"),
        ]

    def _cart_page(self) -> Response:
        rows = "".join(
            f"<li>{html.escape(self.items[i])} x {n}</li>" for i, n in sorted(self.cart.items())
        )
        return page(
            "Cart",
            "<h1>Your cart</h1>"
            + (f"<ul>{rows}</ul>" if rows else "<p>The cart is empty.</p>")
            + "<form method='post' action='/checkout'><button type='submit'>Check out</button>"
            "</form><a href='/'>Continue shopping</a>",
        )

    def respond(self, request: Request) -> Response:
        if request.path == "/":
            rows = "".join(
                f"<li><a href='/product/{i}'>{html.escape(t)}</a> ${self.prices[i]}</li>"
                for i, t in enumerate(self.items)
            )
            return page("Shop", f"<h1>Shop</h1><ul>{rows}</ul><a href='/cart'>Cart</a>")
        if request.path.startswith("/product/"):
            try:
                i = int(request.path.removeprefix("/product/"))
                title = self.items[i]
            except (ValueError, IndexError):
                return not_found(request.path)
            options = "".join(f"<option>{n}</option>" for n in range(1, 6))
            return page(
                title,
                f"<h1>{html.escape(title)}</h1><p>Price: ${self.prices[i]}</p>"
                f"<form method='post' action='/cart/add'><input type='hidden' name='item' value='{i}'>"
                f"<label for='q'>Quantity</label><select id='q' name='qty'>{options}</select>"
                "<button type='submit'>Add to cart</button></form><a href='/'>Back to the shop</a>",
            )
        if request.path == "/cart":
            return self._cart_page()
        if request.path == "/cart/add" and request.method == "POST":
            try:
                i, n = int(request.form.get("item", "")), int(request.form.get("qty", ""))
            except ValueError:
                return not_found(request.path)
            if 0 <= i < len(self.items) and 1 <= n <= 5:
                self.cart[i] = self.cart.get(i, 0) + n
            return self._cart_page()
        if request.path == "/checkout" and request.method == "POST":
            self.order = dict(self.cart)
            ok = self._grade(
                self.target in self.order,
                self.order.get(self.target) == self.quantity,
                set(self.order) <= {self.target},
            )
            self.reward, self.done = (1.0 if ok else 0.0), True
            return page("Order placed", "<h1>Thank you</h1><p>Your order was placed.</p>")
        return not_found(request.path)


class SettingsSite(Site):
    """Change an account's settings on a page reached from the dashboard's navigation."""

    name = "settings"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.language = _pick(rng, LANGUAGES)[0]
        self.time_zone = _pick(rng, TIME_ZONES)[0]
        self.alerts = bool(rng.integers(0, 2))
        self.saved: dict[str, str] | None = None

    @property
    def instruction(self) -> str:
        alerts = "turn email alerts on" if self.alerts else "leave email alerts off"
        return (
            f'Open the settings, set the language to "{self.language}" and the time zone to '
            f'"{self.time_zone}", {alerts}, and save.'
        )

    @property
    def plan(self) -> list[PlanStep]:
        steps = [
            PlanStep(verb="click", role="link", name="Settings"),
            PlanStep(verb="select", role="combobox", name="Language", text=self.language),
            PlanStep(verb="select", role="combobox", name="Time zone", text=self.time_zone),
        ]
        if self.alerts:
            steps.append(PlanStep(verb="click", role="checkbox", name="Email alerts"))
        return [*steps, PlanStep(verb="click", role="button", name="Save")]

    def respond(self, request: Request) -> Response:
        nav = (
            "<nav><a href='/'>Home</a> <a href='/profile'>Profile</a> "
            "<a href='/settings'>Settings</a> <a href='/help'>Help</a></nav>"
        )
        if request.path == "/settings" and request.method == "POST":
            f = self.saved = dict(request.form)
            ok = self._grade(
                f.get("language") == self.language,
                f.get("zone") == self.time_zone,
                ("alerts" in f) == self.alerts,
            )
            self.reward, self.done = (1.0 if ok else 0.0), True
            return page("Saved", nav + "<h1>Settings saved</h1>")
        if request.path == "/settings":
            languages = "".join(f"<option>{html.escape(x)}</option>" for x in LANGUAGES)
            zones = "".join(f"<option>{z}</option>" for z in TIME_ZONES)
            return page(
                "Settings",
                nav + "<h1>Settings</h1><form method='post' action='/settings'>"
                f"<label for='l'>Language</label><select id='l' name='language'>{languages}</select>"
                f"<label for='z'>Time zone</label><select id='z' name='zone'>{zones}</select>"
                "<label><input type='checkbox' name='alerts'> Email alerts</label>"
                "<button type='submit'>Save</button></form>",
            )
        if request.path == "/":
            return page("Dashboard", nav + "<h1>Dashboard</h1><p>Welcome back.</p>")
        if request.path in ("/profile", "/help"):
            title = request.path.strip("/").title()
            return page(title, nav + f"<h1>{title}</h1><p>Nothing to change here.</p>")
        return not_found(request.path)


SITES: dict[str, Callable[[np.random.Generator], Site]] = {
    "login": LoginSite,
    "search": SearchSite,
    "form": FormSite,
    "cart": CartSite,
    "settings": SettingsSite,
}
"""Our task types by name; each builds its site from a random generator (the seed's content)."""

TASKS = tuple(SITES)
