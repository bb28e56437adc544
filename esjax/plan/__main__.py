"""``python -m esjax.plan``: print the per-device memory plan of a run and whether it fits (exit 3 if not)."""

from __future__ import annotations

import argparse
import json

from esjax.cli.common import run_cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m esjax.plan", description=__doc__)
    p.add_argument("--model", required=True, help="HF folder (config.json) or a built-in name, e.g. Qwen2.5-7B")
    p.add_argument("--mesh", default="data=1,model=1", help="data=D,model=M (per-device numbers use these sizes)")
    p.add_argument("--population", type=int, default=30, help="N, accepted members per update")
    p.add_argument("--max-lag", type=int, default=1, help="K: θ of K+1 versions stay live")
    p.add_argument("--batch", type=int, help="sequences in the KV cache at once (default: N)")
    p.add_argument("--context", type=int, default=2048, help="KV-cache slots per sequence")
    p.add_argument("--prefill", type=int, help="tokens per prefill call (default: min(context, 512))")
    p.add_argument("--dtype", default="bf16", help="bf16 | f32 | f16 (parameters, activations, cache)")
    p.add_argument("--device-memory", default="80GB", help="per-device memory, e.g. 80GB, 141GB, 16GiB")
    p.add_argument("--headroom", type=float, default=0.9, help="usable fraction of device memory")
    p.add_argument("--mode", choices=("lowrank", "full"), default="lowrank")
    p.add_argument("--rank", type=int, default=1, help="low-rank perturbation rank r")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="sgd")
    p.add_argument("--anchor", action="store_true", help="anchor decay keeps θ_0")
    p.add_argument("--episodes-per-member", type=int, default=1)
    p.add_argument("--compile", action="store_true",
                   help="also compile the real sharded update on abstract inputs and print XLA's memory analysis "
                        "(on CPU, data*model simulated devices; takes tens of seconds)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "f32": "float32", "fp32": "float32", "float32": "float32",
           "f16": "float16", "fp16": "float16", "float16": "float16"}


def jax_backend() -> str:
    import jax

    return jax.default_backend()


def _prepare_devices(n: int) -> None:
    """Before JAX starts: expose ``n`` CPU devices when the CPU backend will be used."""
    import contextlib
    import os

    import jax

    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms in ("", "cpu"):
        with contextlib.suppress(RuntimeError):  # backends already started (in-process callers): use those
            jax.config.update("jax_num_cpu_devices", n)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from esjax.errors import UserError
    from esjax.model.config import ModelConfigError
    from esjax.model.sharding import MeshError, parse_mesh
    from esjax.plan.memory import parse_bytes, plan_memory
    from esjax.plan.models import resolve_model

    if args.dtype.lower() not in _DTYPES:
        raise UserError(f"--dtype {args.dtype!r}: expected one of {', '.join(_DTYPES)}")
    try:
        mesh = parse_mesh(args.mesh)
        memory = parse_bytes(args.device_memory)
    except (MeshError, ValueError) as err:
        raise UserError(f"{err}") from None
    if mesh["data"] == 0:
        raise UserError("--mesh: give data explicitly (the planner does not look at devices)")
    if args.compile:
        _prepare_devices(mesh["data"] * mesh["model"])
    try:
        config, label = resolve_model(args.model)
    except ModelConfigError as err:
        raise UserError(str(err)) from None
    try:
        plan = plan_memory(config, data=mesh["data"], model=mesh["model"], population=args.population,
                           max_lag=args.max_lag, batch=args.batch, context=args.context, prefill=args.prefill,
                           dtype=_DTYPES[args.dtype.lower()], device_memory=memory, mode=args.mode, rank=args.rank,
                           optimizer=args.optimizer, anchor=args.anchor,
                           episodes_per_member=args.episodes_per_member, headroom=args.headroom, label=label)
    except ValueError as err:
        raise UserError(str(err)) from None
    measured = None
    if args.compile:
        from esjax.plan.memory import GiB, measure_update

        measured = measure_update(config, data=mesh["data"], model=mesh["model"], population=args.population,
                                  mode=args.mode, rank=args.rank, optimizer=args.optimizer,
                                  dtype=_DTYPES[args.dtype.lower()])
    if args.json:
        print(json.dumps({**plan.to_dict(), "compiled_update": measured}, indent=2))
    else:
        print(plan.to_text())
        if measured is not None:
            print(f"  compiled update (XLA memory analysis, {jax_backend()}): arguments "
                  f"{measured['argument_bytes'] / GiB:.3f} GiB, outputs {measured['output_bytes'] / GiB:.3f} GiB, "
                  f"temporaries {measured['temp_bytes'] / GiB:.3f} GiB per device; θ stays sharded: "
                  f"{measured['params_sharded_like_input']}")
    return 0 if plan.fits else 3


if __name__ == "__main__":
    run_cli(main)
