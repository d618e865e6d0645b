"""GUI envs: task websites in real headless Chromium driven through Playwright.

    env.py       gui/Browser-v0 (BrowserEnv): observe, act, reward
    session.py   one Chromium per process, isolated contexts (BrowserPool, Session, the guard)
    tasks.py     the task sites (login, search, form, cart, settings) and their checkers
    actions.py   parsing an assistant reply into an action (pure Python)
    tree.py      pruning and rendering the page's element tree (pure Python)
    snapshot.js  the script that reads the element tree out of the page

Needs the ``gui`` extra (playwright) and Debian's chromium
(``scripts/install-sandbox-deps.sh --browser``). See docs/guides/gui.md.
"""
