"""The task seam: what a task implements so that the trainer, evaluation, the command-line programs and the Ray
pool can run it without knowing it.

A task is a subclass of :class:`Task` in its own package (``envs/webshop_bridge/task.py`` is the reference;
``envs/babyai_bridge`` is plugged in the same way; a user's task lives wherever it is importable). A run's
config names it with ``env.task``: a registered name (:data:`TASKS`) or an entry-point-style dotted path
``package.module:Name``. The task declares its own ``env`` keys as a pydantic model (:attr:`Task.Options`); the
config validates them beside the keys every task has (``tasks_per_member``, ``max_steps``, ``eval_goals``,
``eval_split``, ``pool``, ...), with the same strict types and one-line errors, and the task reads them from
``self.env``. Nothing under ``esjax/`` imports a task: :func:`task_class` imports the named module when a config
is validated.

What a task implements (the rest has defaults):

* data and splits: :meth:`Task.load` (once, lazily: :attr:`Task.data`) and :meth:`Task.split` (goal indices of
  ``train`` / ``eval`` / ``test``, which never overlap; a goal index is a deterministic instance);
* env pools: :meth:`Task.pool` (sessions in this process, an :class:`esjax.loop.protocols.EnvPool`),
  :meth:`Task.pool_recipe` (a picklable ``make_pool(n)`` for Ray actors, ``env.pool: ray``) and
  :meth:`Task.process_pool` (worker processes, ``env.pool: process``);
* agents: :meth:`Task.score_agent` (``agent.mode: score``, an :class:`esjax.loop.protocols.ScoringAgent`) and, where
  the task has one, :meth:`Task.generate_agent` (``agent.mode: generate``);
* :meth:`Task.texts`: text a from-scratch tokenizer is trained on (``model.source: random``);
* behaviour measures: :meth:`Task.behaviour` of an evaluation's trace lines and :attr:`Task.behaviour_rows`, the
  rows summary.md shows;
* input errors: subclasses of :class:`esjax.errors.TaskError`, whose one-line message names the file, key or field.

The reward is the env's, in [0, 1]; a score is 100 × the mean reward over the held-out goals.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from esjax.errors import TaskError

if TYPE_CHECKING:
    from esjax.agent.policy import LoadedPolicy
    from esjax.loop.protocols import EnvPool, GeneratingAgent, ScoringAgent

#: Registered task names and the classes they stand for (``env.task: webshop`` is the default).
TASKS: dict[str, str] = {
    "webshop": "envs.webshop_bridge.task:WebShopTask",
    "babyai": "envs.babyai_bridge.task:BabyAITask",
}
DEFAULT_TASK = "webshop"

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class NoOptions(BaseModel):
    """The options of a task without ``env`` keys of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Task:
    """A task, bound to a run's ``env`` section (``self.env``: the keys every task has and the task's own
    :attr:`Options`). Subclass it and override what the module docstring lists; ``load`` and ``split``, ``pool`` and
    ``score_agent`` are required."""

    #: The task's own ``env`` keys: a pydantic model whose fields are read as ``self.env.<key>``. Its validators see
    #: the whole ``env`` section; a ``ValueError`` naming the key (``"env.data: ..."``) is reported as one line.
    Options: ClassVar[type[BaseModel]] = NoOptions
    #: Rows of summary.md's behaviour table: (key of :meth:`behaviour`'s dict, label, format).
    behaviour_rows: ClassVar[tuple[tuple[str, str, str], ...]] = ()

    def __init__(self, env: Any) -> None:
        self.env = env
        self._data: Any = None
        self._loaded = False

    # -- data and splits -------------------------------------------------------------------------------------------

    def load(self) -> Any:
        """The task's data (read once, on first use of :attr:`data`); raises a :class:`TaskError` for bad input."""
        return None

    @property
    def data(self) -> Any:
        if not self._loaded:
            self._data, self._loaded = self.load(), True
        return self._data

    def split(self, name: str) -> Sequence[int]:
        """The goal indices of split ``name`` (``train``, ``eval`` or ``test``; the three never overlap)."""
        raise NotImplementedError(f"{type(self).__name__}.split")

    def data_name(self) -> str:
        """What the data is called in printed lines (WebShop: the shop's name)."""
        return type(self).__name__

    def goal_label(self) -> str:
        """Which goals these are in printed lines (``… 200 test <label> goals``); empty: nothing to add."""
        return ""

    def texts(self) -> Iterable[str]:
        """Text a tokenizer trained from scratch learns its vocabulary from (``model.source: random``)."""
        raise TaskError(f"model.source: 'random' trains a tokenizer on the task's texts; {type(self).__name__} "
                        "has none (Task.texts)")

    # -- env pools -------------------------------------------------------------------------------------------------

    def pool(self, n: int) -> EnvPool:
        """``n`` env sessions in this process."""
        raise NotImplementedError(f"{type(self).__name__}.pool")

    def pool_recipe(self) -> Callable[[int], EnvPool] | None:
        """A picklable ``make_pool(n)`` that builds ``n`` sessions in another process (a Ray actor) from the task's
        data there; None: the task has no such recipe (``env.pool: ray`` is then an error)."""
        return None

    def process_pool(self, n: int, workers: int) -> EnvPool:
        """``n`` env sessions spread over ``workers`` worker processes (``env.pool: process``): by default
        :class:`~esjax.loop.envpool_process.ProcessEnvPool` over :meth:`pool_recipe`."""
        from esjax.loop.envpool_process import ProcessEnvPool

        return ProcessEnvPool(self.required_recipe("process"), n, workers=workers)

    def required_recipe(self, pool: str) -> Callable[[int], EnvPool]:
        """:meth:`pool_recipe`, or the one-line error that ``env.pool: <pool>`` needs one."""
        recipe = self.pool_recipe()
        if recipe is None:
            raise TaskError(f"env.pool: {pool!r} is not available for task {type(self).__name__} (it has no pool "
                            "recipe, Task.pool_recipe)")
        return recipe

    # -- agents ----------------------------------------------------------------------------------------------------

    def score_agent(self, policy: LoadedPolicy, settings: Any, prompt_style: str) -> ScoringAgent:
        """Score mode's agent (``settings``: the config's ``agent`` section; ``prompt_style``: ``compact`` or
        ``chat``, resolved)."""
        raise NotImplementedError(f"{type(self).__name__}.score_agent")

    def generate_agent(self, policy: LoadedPolicy, settings: Any) -> GeneratingAgent:
        """Generate mode's agent, where the task has one."""
        raise TaskError(f"agent.mode: 'generate' is not available for task {type(self).__name__} (use score)")

    # -- behaviour measures and settings ---------------------------------------------------------------------------

    @staticmethod
    def is_success(reward: float) -> bool:
        """Whether an episode with ``reward`` was won (the success rate of evaluations). Default: the full reward,
        1.0, WebShop's rule; a task whose winning rewards vary (BabyAI's shrink with the steps taken) overrides it."""
        return reward == 1.0  # the records' default too (esjax.rundir.stats.full_marks, a layer above this one)

    def behaviour(self, lines: Iterable[dict[str, Any]]) -> dict[str, float | None]:
        """What a greedy agent did, from an evaluation's trace lines (:mod:`esjax.rundir.traces`): the measures
        :attr:`behaviour_rows` name, and any others."""
        return {}

    def applies(self, key: str) -> bool:
        """Whether the dotted ``env`` key means anything in this setting (printed settings leave the others out)."""
        return True

    def portable_env(self, env: dict[str, Any]) -> dict[str, Any]:
        """The ``env`` section (dumped) as an export records it for a later evaluation elsewhere (e.g. data paths
        made absolute)."""
        return env


def task_class(name: str) -> type[Task]:
    """The :class:`Task` subclass ``name`` stands for: a registered name (:data:`TASKS`) or ``package.module:Name``.
    Raises :class:`TaskError` naming ``env.task`` when it cannot be imported or is not a task."""
    target = TASKS.get(name, name)
    if not isinstance(name, str) or not _DOTTED.match(target):
        raise TaskError(f"env.task: {str(name)[:200]!r} is neither a registered task ({', '.join(TASKS)}) nor a "
                        "dotted path 'package.module:Name'")
    module_name, _, attribute = target.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise TaskError(f"env.task: {name!r}: cannot import {module_name} ({err})") from None
    for part in attribute.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise TaskError(f"env.task: {name!r}: {module_name} has no {attribute}")
    if not (isinstance(found, type) and issubclass(found, Task)):
        raise TaskError(f"env.task: {name!r}: {target} is not a subclass of esjax.task.Task")
    return found
