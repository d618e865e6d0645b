"""A tiny text grid world: walk to the goal with up / down / left / right.

    obs:  "Reach G. Reply up, down, left or right.\n#####\n#A..#\n#.#.#\n#..G#\n#####"
    assistant "right" -> user (the new grid)      ... reaching G: terminated, reward shaped by moves

The layout (start, goal, interior walls) comes from ``self.np_random``; every layout is
checked solvable by breadth-first search, which is also the ``demonstration()``. The last of
the four words in the reply is the move; a reply without one, or a move into a wall, costs a
turn and says so. Running out of ``max_turns`` ends the game (terminated) with reward 0.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from agentrl.env import Env, Info, Observation, StepResult
from agentrl.errors import ConfigError
from agentrl.types import Message

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_MOVE = re.compile(r"\b(up|down|left|right)\b", re.I)
Cell = tuple[int, int]


class GridWorldEnv(Env):
    """Walk from A to G on a small walled grid.

    Args:
        size: interior side length.
        walls: interior wall cells.
        max_turns: moves allowed.
        turn_penalty: share of the reward extra moves can take away.
    """

    def __init__(
        self, *, size: int = 3, walls: int = 1, max_turns: int = 10, turn_penalty: float = 0.5
    ):
        if size < 2 or walls < 0 or walls > size * size - 2 or max_turns < 2:
            raise ConfigError(
                f"GridWorldEnv needs size >= 2, 0 <= walls <= size^2 - 2, max_turns >= 2; "
                f"got size={size}, walls={walls}, max_turns={max_turns}"
            )
        self.size, self.n_walls, self.max_turns, self.turn_penalty = (
            size,
            walls,
            max_turns,
            turn_penalty,
        )
        self.walls: set[Cell] = set()
        self.pos: Cell = (0, 0)
        self.start: Cell = (0, 0)
        self.goal: Cell = (0, 0)
        self.turns = 0

    def _layout(self) -> None:
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        while True:
            order = self.np_random.permutation(len(cells))
            picked = [cells[int(i)] for i in order[: self.n_walls + 2]]
            self.start, self.goal, self.walls = picked[0], picked[1], set(picked[2:])
            if self._path() is not None:
                return

    def _path(self) -> list[str] | None:
        """Shortest move list from the start to the goal (BFS), or None."""
        prev: dict[Cell, tuple[Cell, str] | None] = {self.start: None}
        queue = deque(prev)
        while queue:
            cell = queue.popleft()
            if cell == self.goal:
                moves = []
                while prev[cell] is not None:
                    cell, move = prev[cell]  # type: ignore[misc]
                    moves.append(move)
                return moves[::-1]
            for move, (dr, dc) in MOVES.items():
                nxt = (cell[0] + dr, cell[1] + dc)
                if self._free(nxt) and nxt not in prev:
                    prev[nxt] = (cell, move)
                    queue.append(nxt)
        return None

    def _free(self, cell: Cell) -> bool:
        return 0 <= cell[0] < self.size and 0 <= cell[1] < self.size and cell not in self.walls

    def render_grid(self) -> str:
        rows = ["#" * (self.size + 2)]
        for r in range(self.size):
            line = "".join(
                "A"
                if (r, c) == self.pos
                else "G"
                if (r, c) == self.goal
                else "#"
                if (r, c) in self.walls
                else "."
                for c in range(self.size)
            )
            rows.append(f"#{line}#")
        return "\n".join([*rows, rows[0]])

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        await super().areset(seed=seed)
        self.turns = 0
        self._layout()
        self.pos = self.start
        prompt = f"Reach G. Reply up, down, left or right.\n{self.render_grid()}"
        return [Message(role="user", content=prompt)], {"max_turns": self.max_turns}

    async def astep(self, action: Message) -> StepResult:
        self.turns += 1
        found = _MOVE.findall(action.text)
        if not found:
            reply = "Reply up, down, left or right."
        else:
            dr, dc = MOVES[found[-1].lower()]
            nxt = (self.pos[0] + dr, self.pos[1] + dc)
            blocked = not self._free(nxt)
            if not blocked:
                self.pos = nxt
            reply = f"Blocked.\n{self.render_grid()}" if blocked else self.render_grid()
        info: Info = {"turns": self.turns, "won": self.pos == self.goal}
        if self.pos == self.goal:
            reward = 1.0 - self.turn_penalty * (self.turns - 1) / self.max_turns
            return [Message(role="user", content=f"{reply}\nGoal!")], reward, True, False, info
        done = self.turns >= self.max_turns
        text = f"{reply}\nGame over." if done else reply
        return [Message(role="user", content=text)], 0.0, done, False, info

    def demonstration(self) -> list[Message] | None:
        """Shortest path from the start (call right after reset)."""
        moves = self._path()
        if moves is None or len(moves) > self.max_turns:
            return None
        out: list[Message] = []
        pos = self.start
        for i, move in enumerate(moves):
            dr, dc = MOVES[move]
            pos = (pos[0] + dr, pos[1] + dc)
            saved, self.pos = self.pos, pos
            grid = self.render_grid()
            self.pos = saved
            last = i == len(moves) - 1
            out += [
                Message(role="assistant", content=move),
                Message(role="user", content=f"{grid}\nGoal!" if last else grid),
            ]
        return out
