"""WebShop as an esjax task (``env.task: webshop``, the default): the reference implementation of
:class:`esjax.task.Task`.

Its ``env`` keys (:class:`WebShopOptions`): ``data`` (``synthetic``, the packaged ``webshop_small`` or a folder of
WebShop data files), ``num_products`` (the synthetic shop's size), ``catalog_seed``, ``goals`` (``templated`` or
``human``) and ``human_file``. Data: a :class:`~envs.webshop_bridge.shop.Shop` built from a
:class:`~envs.webshop_bridge.factory.ShopSpec`, whose ``train`` / ``eval`` / ``test`` splits are WebShop's. Pools:
:class:`~envs.webshop_bridge.pool.InProcessEnvPool` in this process,
:class:`~envs.webshop_bridge.process_pool.ProcessEnvPool` in worker processes and, through esjax's Ray pool,
``pool_of(spec, n)`` in each actor. Agents: :class:`esjax.agent.webshop.WebShopAgent` (score mode: candidate
descriptions) and :class:`esjax.agent.generate_agent.GenerateAgent` (generate mode: written ``search[...]`` /
``click[...]``). Behaviour measures: :mod:`.behaviour`. Input errors: :class:`~envs.webshop_bridge.errors.DataError`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from esjax.config.schema import MAX_SEED, path_problem
from esjax.task import Task

from . import behaviour as _behaviour
from .errors import DataError
from .factory import ShopSpec, pool_of
from .pool import InProcessEnvPool
from .shop import PACKAGED_DATA

#: Deprecated names of env.goals values: ``synthetic`` was WebShop's templated goal set (items_ins_v2).
GOAL_SET_ALIASES = {"synthetic": "templated"}


class WebShopOptions(BaseModel):
    """WebShop's ``env`` keys: which shop, which goals."""

    data: str = Field("synthetic", description="'synthetic', 'webshop_small' (the packaged real 1,000-product set) "
                                               "or a folder with WebShop data files")
    num_products: int = Field(300, ge=10, le=10_000_000, description="the synthetic shop's catalog size "
                                                                       "(env.data: synthetic only; a WebShop set "
                                                                       "uses all its products)")
    catalog_seed: int = Field(0, ge=0, le=MAX_SEED)
    goals: Literal["templated", "human"] = Field(
        "templated", description="WebShop's goal set (real data): templated (WebShop's instructions built from the "
                                 "attribute file items_ins_v2, the default) or human (items_human_ins.json: the "
                                 "instructions WebShop's published test scores use); 'synthetic' is a deprecated "
                                 "name of templated. The synthetic shop (env.data: synthetic) has its own goals")
    human_file: str | None = Field(None, description="items_human_ins.json for env.goals=human (default: the one in "
                                                     "the env.data folder)")

    @field_validator("goals", mode="before")
    @classmethod
    def _goals_alias(cls, value: Any) -> Any:
        """``synthetic``, the name before ``templated``: old config.yaml files and exports still load and resume
        (it never meant the synthetic shop)."""
        return GOAL_SET_ALIASES.get(value, value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> WebShopOptions:
        if self.data not in ("synthetic", *PACKAGED_DATA) and path_problem(self.data, "dir") is not None:
            problem = path_problem(self.data, "any") or "is not a directory"
            raise ValueError(f"env.data: {self.data[:200]!r} {problem} "
                             f"(expected 'synthetic', {', '.join(map(repr, PACKAGED_DATA))} or a data folder)")
        if self.goals == "human" and self.data == "synthetic":
            raise ValueError("env.goals: 'human' needs real WebShop data (env.data: a folder with "
                             "items_human_ins.json); the synthetic shop has only its own generated goals")
        if self.human_file is not None and (problem := path_problem(self.human_file, "file")) is not None:
            raise ValueError(f"env.human_file: {self.human_file[:200]!r} {problem}")
        return self


class WebShopTask(Task):
    """WebShop (or the built-in synthetic shop) as an esjax task."""

    Options = WebShopOptions
    behaviour_rows = _behaviour.BEHAVIOUR_ROWS

    @functools.cached_property
    def spec(self) -> ShopSpec:
        """The shop as a picklable recipe: what env worker processes and Ray actors build their own copy from."""
        env = self.env
        if env.data == "synthetic":
            return ShopSpec(kind="synthetic", num_products=env.num_products, seed=env.catalog_seed)
        human_file = str(Path(env.human_file).expanduser()) if env.human_file else None
        path = env.data if env.data in PACKAGED_DATA else str(Path(env.data).expanduser())
        return ShopSpec(kind="webshop", path=path, seed=env.catalog_seed, goals=env.goals, human_file=human_file)

    def load(self):
        """The shop: a synthetic catalog or WebShop data from a folder (a bad file: a DataError naming env.data)."""
        try:
            return self.spec.build()
        except DataError as err:
            raise DataError("env.data", str(err)) from None

    def split(self, name: str) -> Sequence[int]:
        return self.data.split(name)

    def data_name(self) -> str:
        return self.data.name

    def goal_label(self) -> str:
        """``templated`` / ``human`` WebShop goals, or the synthetic shop's own (env.goals does not apply to it)."""
        return "synthetic-shop" if self.env.data == "synthetic" else self.env.goals

    def texts(self) -> Iterable[str]:
        return shop_texts(self.data)

    def pool(self, n: int) -> InProcessEnvPool:
        return InProcessEnvPool(self.data, n)

    def pool_recipe(self):
        return functools.partial(pool_of, self.spec)

    def score_agent(self, policy, settings, prompt_style: str):
        from esjax.agent.webshop import WebShopAgent

        return WebShopAgent(policy.tokenizer, prompt_style, policy.chat_renderer(), settings.max_prompt_tokens,
                            settings.max_candidate_tokens, settings.score_norm)

    def generate_agent(self, policy, settings):
        return generate_agent(policy, settings)

    def behaviour(self, lines: Iterable[dict[str, Any]]) -> dict[str, float | None]:
        return _behaviour.behaviour(lines)

    def applies(self, key: str) -> bool:
        """The catalog size only for the synthetic shop, the WebShop goal set only for real data."""
        if key == "env.num_products":
            return self.env.data == "synthetic"
        return not (key in ("env.goals", "env.human_file") and self.env.data == "synthetic")

    def portable_env(self, env: dict[str, Any]) -> dict[str, Any]:
        """A data folder made absolute (the packaged set and the synthetic shop keep their names)."""
        if env["data"] != "synthetic" and env["data"] not in PACKAGED_DATA:
            env = {**env, "data": str(Path(env["data"]).expanduser().resolve())}
        return env


def shop_texts(shop, limit: int = 5000) -> Iterable[str]:
    """Text a from-scratch tokenizer is trained on: instructions, titles and option values."""
    for i in range(min(len(shop.goals), limit)):
        yield shop.goals[i].instruction_text.lower()
    for i in range(min(len(shop), limit)):
        product = shop.product(i)
        yield f"open {product.title} choose buy now go back next page back to search page: results item chosen"


def generate_agent(policy, settings):
    """Generate mode's agent for ``policy`` with the ``agent`` section ``settings``: the chat template when the
    model has one (a plain rendering otherwise), and the model's end-of-sequence tokens as stop tokens."""
    from esjax.agent.generate_agent import GenerateAgent

    renderer = policy.chat_renderer() if settings.prompt_style != "compact" else None
    return GenerateAgent(policy.tokenizer, renderer, policy.stop_token_ids(), settings.max_prompt_tokens,
                         settings.reasoning, constrain=settings.constrain)
