"""esjax: bounded-staleness asynchronous evolution strategies for LLM agents, in JAX.

The words that name one thing each (update, version, update record, step, update memory, engine, schedule,
evaluation) are listed in README's "Layout" section.
"""

__version__ = "0.1.0"
