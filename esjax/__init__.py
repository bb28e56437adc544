"""esjax: bounded-staleness asynchronous evolution strategies for LLM agents, in JAX."""

__version__ = "0.1.0"
