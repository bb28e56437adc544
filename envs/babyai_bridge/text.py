"""The text side of the bridge: action phrases, the written-action grammar, and observations in words.

Actions: the six that act in BabyAI (minigrid's ``done`` does nothing and is left out), each with one canonical
phrase (:data:`ACTION_TEXTS`, the candidates of score mode). Generate mode's grammar (:func:`parse_action`): the
whole reply, lower-cased, with runs of whitespace collapsed and a final ``.`` or ``!`` dropped, must be one of the
phrases or aliases in :data:`ALIASES`; anything else is not an action.

Observations (:func:`describe`) are written from minigrid's own egocentric observation (the 7×7 ``image`` of what
the agent sees, walls and closed doors blocking sight), so they tell exactly what a BabyAI agent sees: the mission,
the agent's heading, what it carries, the cell in front of it, every visible object and door with its colour, state
and offset ("2 steps ahead and 1 to the left"), and the nearest visible wall straight ahead, left and right.
"""

from __future__ import annotations

import re

import numpy as np

#: minigrid's action ids, in the order of ``MiniGridEnv.Actions``.
LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE, DONE = range(7)

#: Canonical phrase of each acting action, in minigrid's id order (index = action id).
ACTION_TEXTS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
ACTION_IDS = {text: i for i, text in enumerate(ACTION_TEXTS)}

#: Other spellings the grammar accepts (normalised as in :func:`parse_action`).
ALIASES = {
    "left": LEFT, "rotate left": LEFT,
    "right": RIGHT, "rotate right": RIGHT,
    "forward": FORWARD, "move forward": FORWARD, "go ahead": FORWARD,
    "pickup": PICKUP, "pick it up": PICKUP,
    "drop it": DROP, "put down": DROP,
    "open": TOGGLE, "toggle door": TOGGLE,
}

_WS = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _WS.sub(" ", text).strip().lower().rstrip(".!").rstrip()


def parse_action(text: str) -> int | None:
    """The minigrid action id ``text`` names, or None when it names none (the env then does a no-op)."""
    if not isinstance(text, str):
        return None
    key = normalise(text)
    if key in ACTION_IDS:
        return ACTION_IDS[key]
    return ALIASES.get(key)


# minigrid's encoding (minigrid.core.constants), fixed here so that an observation is a pure function of the image.
_OBJECTS = {4: "door", 5: "key", 6: "ball", 7: "box", 8: "goal square", 9: "lava cell"}
_WALL, _EMPTY, _UNSEEN = 2, 1, 0
_COLOURS = ("red", "green", "blue", "purple", "yellow", "grey")
_DOOR_STATES = ("open", "closed", "locked")
HEADINGS = ("east", "south", "west", "north")  # minigrid agent_dir 0..3


def _thing(obj: int, colour: int, state: int) -> str:
    name = _OBJECTS[obj]
    if obj == 4:
        return f"an {_DOOR_STATES[state]} {_COLOURS[colour]} door" if state == 0 else \
            f"a {_DOOR_STATES[state]} {_COLOURS[colour]} door"
    if obj in (8, 9):
        return f"a {name}"
    return f"a {_COLOURS[colour]} {name}"


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _offset(ahead: int, right: int) -> str:
    parts = []
    if ahead:
        parts.append(f"{_steps(ahead)} ahead")
    if right:
        side = "right" if right > 0 else "left"
        parts.append(f"{abs(right)} to the {side}" if ahead else f"{_steps(abs(right))} to the {side}")
    return " and ".join(parts)


def describe(mission: str, image: np.ndarray, direction: int, carrying: tuple[int, int] | None) -> str:
    """The observation text of one step.

    ``image``: minigrid's ``obs['image']`` (``[x, y, (object, colour, state)]``, the agent at the bottom middle cell
    facing up); ``direction``: ``obs['direction']``; ``carrying``: (object id, colour id) of what the agent holds.
    """
    w, h = image.shape[0], image.shape[1]
    ax, ay = w // 2, h - 1
    lines = [f"Mission: {mission}.", f"You face {HEADINGS[direction]}."]
    lines.append("You carry nothing." if carrying is None else f"You carry {_thing(carrying[0], carrying[1], 0)}.")
    front = image[ax, ay - 1]
    if front[0] == _UNSEEN:
        lines.append("In front of you: something you cannot see.")
    elif front[0] == _EMPTY:
        lines.append("In front of you: an empty cell.")
    elif front[0] == _WALL:
        lines.append("In front of you: a wall.")
    else:
        lines.append(f"In front of you: {_thing(*front)}.")
    seen = []
    for x in range(w):
        for y in range(h):
            obj = int(image[x, y, 0])
            if obj in _OBJECTS and (x, y) != (ax, ay):
                ahead, right = ay - y, x - ax
                seen.append((ahead + abs(right), ahead, right, _thing(obj, int(image[x, y, 1]), int(image[x, y, 2]))))
    seen.sort()
    if seen:
        lines.append("You see " + "; ".join(f"{t} {_offset(a, r)}" for _, a, r, t in seen) + ".")
    else:
        lines.append("You see no objects.")
    walls = []
    for label, cells in (("ahead", [(ax, y) for y in range(ay - 1, -1, -1)]),
                         ("to the left", [(x, ay) for x in range(ax - 1, -1, -1)]),
                         ("to the right", [(x, ay) for x in range(ax + 1, w)])):
        for d, (x, y) in enumerate(cells, start=1):
            if image[x, y, 0] == _WALL:
                walls.append(f"{_steps(d)} {label}")
                break
            if image[x, y, 0] != _EMPTY:
                break  # an object, a door or unseen cells hide what lies behind them on this line
    if walls:
        lines.append("Walls: " + "; ".join(walls) + ".")
    return "\n".join(lines)
