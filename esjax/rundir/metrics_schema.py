"""The schema of ``metrics.jsonl``: every record kind, its fields and each field's one type and meaning.

A field means the same in every kind that has it (``accepted`` in an update record and in the end record both
count the members of *applied* updates; ``lag_hist`` is that running histogram in both). README's
"metrics.jsonl records" section is this module in prose. Every record the trainer writes carries
``schema_version`` (:data:`SCHEMA_VERSION`); records without it are schema 1, written before it existed, whose
update records hold the cohort's lags as a ``{lag: count}`` dict in ``lag_hist`` and the running totals
*including* the open cohort (read them with :func:`cohort_lags`).

Types: ``int``; ``float`` (an int is accepted, ``null`` stands for NaN/inf); ``str``; ``ints`` / ``floats``
(lists); ``counts`` (``{name: int}``); ``member`` (``[version, index]``).
"""

from __future__ import annotations

from typing import Any

#: 2: update records' ``lag_hist`` / ``accepted`` / ``accepted_time`` / ``stale_fraction`` are running totals
#: of applied updates (as in the end record) and ``open_cohort`` is new; the cohort's lags are only in
#: ``cohort_lag_hist``. 1 (no ``schema_version`` field): before.
SCHEMA_VERSION = 2

# field -> (type, meaning)
COMMON: dict[str, tuple[str, str]] = {
    "kind": ("str", "update, eval, event or end"),
    "schema_version": ("int", "this schema's version"),
    "version": ("int", "θ version the record is about (update: the version it produced; event: t + 1)"),
    "wall_time": ("float", "run seconds since the start (resumes continue the clock)"),
}

TOTALS: dict[str, tuple[str, str]] = {
    "tick": ("int", "rollout ticks so far"),
    "dispatched": ("int", "members dispatched so far"),
    "completed": ("int", "members whose fitness came back so far"),
    "accepted": ("int", "members in applied updates so far (N per applied update)"),
    "accepted_time": ("float", "rollout ticks of the members in applied updates"),
    "lag_hist": ("ints", "lags of the members in applied updates so far, index = lag 0..K"),
    "stale_fraction": ("float", "share of the members in applied updates with lag > 0"),
    "discarded": ("int", "results discarded so far"),
    "discarded_by": ("counts", "discarded by reason: too_stale, schedule, nonfinite, rejected_update, abandoned"),
    "cancelled": ("int", "jobs cancelled (end of run: in flight, held, and the unapplied open cohort)"),
    "in_flight": ("int", "jobs running now"),
    "held": ("int", "results held back by the schedule now"),
    "wasted_time": ("float", "rollout ticks of discarded and cancelled work"),
    "rejected_updates": ("int", "updates refused (θ would turn non-finite)"),
}

KINDS: dict[str, dict[str, tuple[str, str]]] = {
    "update": {
        **TOTALS,
        "open_cohort": ("int", "members already accepted into the next, unapplied cohort"),
        "cohort_lag_hist": ("ints", "this update's cohort: member count per lag, index = lag"),
        "cohort_stale_fraction": ("float", "this cohort's share of members with lag > 0"),
        "durations": ("floats", "rollout ticks of each cohort member, in acceptance order"),
        "fitness_mean": ("float", "cohort fitness mean (valid members)"),
        "fitness_std": ("float", "cohort fitness standard deviation"),
        "fitness_max": ("float", "cohort fitness maximum"),
        "fitness_min": ("float", "cohort fitness minimum"),
        "n_valid": ("float", "members with finite fitness"),
        "n_dropped": ("float", "members dropped for non-finite fitness"),
        "noise_draws": ("float", "distinct noise draws the update regenerated"),
        "sigma": ("float", "σ of the update's version"),
        "grad_norm": ("float", "|g|, the ES gradient's norm"),
        "update_norm": ("float", "|θ_{t+1} − θ_t|"),
        "lag_mean": ("float", "mean lag of the cohort"),
        "lag_max": ("float", "largest lag in the cohort"),
        "slot_utilization": ("float", "busy share of rollout slots since the previous update"),
        "rows_per_tick": ("float", "forward rows per tick since the previous update"),
        "episodes_per_s": ("float", "training episodes per second since the previous update"),
        "tokens_per_s": ("float", "tokens per second since the previous update"),
        "seconds": ("float", "wall seconds since the previous update"),
        "invalid_actions": ("int?", "generate mode: invalid actions since the previous update"),
    },
    "eval": {
        "score": ("float", "100 × mean reward over the held-out goals (unperturbed θ, greedy)"),
        "success_rate": ("float", "share of goals with reward 1"),
        "mean_reward": ("float", "mean reward"),
        "score_ci_low": ("float", "95% t interval of the score, low"),
        "score_ci_high": ("float", "95% t interval of the score, high"),
        "success_ci_low": ("float", "95% Wilson interval of the success rate, low"),
        "success_ci_high": ("float", "95% Wilson interval of the success rate, high"),
        "goals": ("int", "held-out goals evaluated"),
        "eval_seconds": ("float", "wall seconds the evaluation took"),
        "invalid_actions": ("int?", "generate mode: invalid actions in the evaluation"),
    },
    "event": {
        "event": ("str", "constant_fitness, stopped, nonfinite_update or env_fault"),
        "at_version": ("int", "θ version when it happened"),
        "tick": ("int", "rollout tick when it happened"),
        "fitness": ("float?", "constant_fitness: the cohort's one fitness value"),
        "members": ("int?", "constant_fitness / nonfinite_update: members of the cohort"),
        "reason": ("str?", "stopped / nonfinite_update / env_fault: why"),
        "rejected": ("int?", "nonfinite_update: updates rejected so far"),
        "action": ("str?", "env_fault: retry, scored_zero or drop_job"),
        "owner_kind": ("str?", "env_fault: train or eval episode"),
        "member": ("member?", "env_fault: [version, index] of the episode's member"),
        "position": ("int?", "env_fault: task position within the member or evaluation"),
        "goal": ("int?", "env_fault: goal index"),
        "step": ("int?", "env_fault: steps taken before the fault"),
    },
    "end": {
        **TOTALS,
        "nonfinite_rejections": ("int", "updates rejected for non-finite parameters"),
    },
}


def _is(value: Any, kind: str) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return value is None or (isinstance(value, int | float) and not isinstance(value, bool))
    if kind == "str":
        return isinstance(value, str)
    if kind in ("ints", "floats", "member"):
        item = "int" if kind != "floats" else "float"
        return (isinstance(value, list) and all(_is(v, item) for v in value)
                and (kind != "member" or len(value) == 2))
    if kind == "counts":
        return isinstance(value, dict) and all(isinstance(k, str) and _is(v, "int") for k, v in value.items())
    raise ValueError(f"unknown schema type {kind!r}")


def problems(record: dict[str, Any], extra_ok: bool = False) -> list[str]:
    """What is wrong with one record against :data:`KINDS` (empty: valid). A ``?`` type is optional; with
    ``extra_ok`` fields the schema does not name are allowed (a custom update hook's metrics)."""
    kind = record.get("kind")
    if kind not in KINDS:
        return [f"unknown kind {kind!r}"]
    fields = {**COMMON, **KINDS[kind]}
    out = []
    for name, (type_, _) in fields.items():
        optional = type_.endswith("?")
        if name not in record:
            if not optional:
                out.append(f"{kind}: missing {name}")
        elif not _is(record[name], type_.rstrip("?")):
            out.append(f"{kind}: {name}={record[name]!r} is not {type_.rstrip('?')}")
    if not extra_ok:
        out += [f"{kind}: unknown field {name}" for name in sorted(set(record) - set(fields))]
    return out


def cohort_lags(record: dict[str, Any]) -> dict[int, int]:
    """``{lag: count}`` of one update record's cohort: from ``cohort_lag_hist`` or, in hand-written records
    that lack it, a schema-1 per-cohort ``lag_hist`` dict."""
    if record.get("cohort_lag_hist") is not None:
        return {lag: int(c) for lag, c in enumerate(record["cohort_lag_hist"]) if c}
    old = record.get("lag_hist")
    return {int(lag): int(c) for lag, c in old.items()} if isinstance(old, dict) else {}
