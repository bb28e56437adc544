"""Memory planning: ``python -m esjax.plan --model NAME --mesh data=D,model=M --population N --max-lag K``.

See :mod:`esjax.plan.memory` for what is counted and :mod:`esjax.plan.models` for the built-in configs.
"""

from esjax.plan.memory import GiB, Line, MemoryPlan, cache_bytes, markdown_table, param_plan, parse_bytes, plan_memory
from esjax.plan.models import BUILTIN, resolve_model

__all__ = ["BUILTIN", "GiB", "Line", "MemoryPlan", "cache_bytes", "markdown_table", "param_plan", "parse_bytes",
           "plan_memory", "resolve_model"]
