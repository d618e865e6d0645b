"""Built-in environments, registered lazily: importing ``envs`` imports no env module.

    reasoning/Task-v0             any reasoning-gym task (task=..., task_config=...)
    reasoning/BasicArithmetic-v0  "Calculate 5 - 3 * 2." (small numbers)
    reasoning/ChainSum-v0         "4 - 1 - 7 =" (small numbers)
    reasoning/LegCounting-v0      "how many legs ... 3 cats, 2 spiders?"
    arith/Calculator-v0           a 2-digit multiplication done with the calculator tool
    arith/Countdown-v0            reach a target from 3 numbers, checked with the calculator
    bench/LongTail-v0             the calculator task as a slow job: k calls of latency_s each,
                                  both drawn per task from long-tailed (lognormal) distributions
                                  (benchmarks/async_rl.py --workload longtail)
    games/GuessNumber-v0          find a number in 1..16 from higher/lower replies
    games/GridWorld-v0            walk to G on a 3x3 text grid with up/down/left/right
    gui/Browser-v0                operate a task website (log in, search, fill a form) in headless
                                  Chromium (needs the gui extra and chromium)
    swe/Repo-v0                   fix a repository task in a sandbox (tasks=, repos_dir=; after
                                  ``agentrl swe prepare``); hidden tests grade it

Each id maps to a ``"module:Class"`` string plus default kwargs (``make_env`` overrides them).
"""

from __future__ import annotations

from agentrl.env import register_env

_LEGS_PREFIX = (
    "Your task is to count how many legs there are in total when given a list of animals.\n\nNow, "
)

register_env(
    "reasoning/Task-v0",
    "envs.reasoning:ReasoningTaskEnv",
    description="Any reasoning-gym task: pass task= and task_config=.",
    task="basic_arithmetic",
)
register_env(
    "reasoning/BasicArithmetic-v0",
    "envs.reasoning:ReasoningTaskEnv",
    description="reasoning-gym basic_arithmetic with 2-3 one-digit terms and + - *.",
    task="basic_arithmetic",
    task_config={
        "min_terms": 2,
        "max_terms": 3,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+", "-", "*"],
    },
)
register_env(
    "reasoning/ChainSum-v0",
    "envs.reasoning:ReasoningTaskEnv",
    description="reasoning-gym chain_sum with 2-3 one-digit terms.",
    task="chain_sum",
    task_config={"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
    strip_prefix="State the final answer to the following arithmetic problem:",
)
register_env(
    "reasoning/LegCounting-v0",
    "envs.reasoning:ReasoningTaskEnv",
    description="reasoning-gym leg_counting with 2-3 kinds of animals.",
    task="leg_counting",
    task_config={"min_animals": 2, "max_animals": 3, "max_instances": 5},
    strip_prefix=_LEGS_PREFIX,
)
register_env(
    "arith/Calculator-v0",
    "envs.countdown:CalculatorEnv",
    description="Multiply two 2-digit numbers using the calculator tool, then answer.",
)
register_env(
    "arith/Countdown-v0",
    "envs.countdown:CountdownEnv",
    description="Reach a target from 3 numbers; verify the expression with the calculator tool.",
)
register_env(
    "bench/LongTail-v0",
    "envs.longtail:LongTailEnv",
    description="Compute with a slow calculator job: the tool calls a task needs and each call's "
    "wait are drawn per task (lognormal, seeded); for benchmarking asynchronous training.",
)
register_env(
    "games/GuessNumber-v0",
    "envs.guess:GuessNumberEnv",
    description="Find a number in 1..16 from 'Too high' / 'Too low' replies.",
)
register_env(
    "games/GridWorld-v0",
    "envs.grid:GridWorldEnv",
    description="Walk to G on a 3x3 text grid with one wall.",
)
register_env(
    "swe/Repo-v0",
    "envs.swe.env:SWEEnv",
    description="Fix a repository task in a sandbox; hidden tests grade the diff (needs "
    "`agentrl swe prepare`; tasks=FILE, repos_dir=DIR).",
)
register_env(
    "gui/Browser-v0",
    "envs.gui.env:BrowserEnv",
    description="A task website (login, search, form; task=None draws one per seed) in headless "
    "Chromium; element-tree observations (observe=both adds screenshots), browser actions.",
)
