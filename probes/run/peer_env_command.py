"""`kvprobe peer-env`: create or check an environment of its own with a
pinned production library or framework (probes.iut.peer_env)."""

from __future__ import annotations

import argparse

from probes.iut import PEER_ENVS
from probes.run import options
from probes.run.subcommand import Command


def arguments(parser: argparse.ArgumentParser) -> None:
    options.add_one(parser, "iut", None, "instead: the environment an IUT declares as its interpreter (a PeerEnv)")
    parser.add_argument("--lib", choices=list(PEER_ENVS), default="jax",
                        help="xla: torch_xla 2.9.0 for kvref-torch-xla (lazy tensors on the XLA CPU "
                        "device; about 7 GB); jax: tpu-sync-jax (probed on JAX CPU arrays anywhere); torch: "
                        "tpu-sync-torch with torch and TorchTPU (for a TPU VM)")
    parser.add_argument("--check", action="store_true", help="only check an existing environment")


def run(args) -> int:
    from probes.iut import create_peer_env, declared_env, iut, peer_env_named, verify_peer_env

    env = peer_env_named(args.lib) if args.iut is None else declared_env(iut(args.iut).interpreter)
    if env is None:
        raise ValueError(f"{args.iut} runs in {iut(args.iut).interpreter}, not an environment kvprobe builds")
    if args.check:
        python = env.python()
        if python is None:
            raise ValueError(env.missing())
        found = verify_peer_env(env, python)
    else:
        found = create_peer_env(env)
    print(f"{env.name} peer environment ok: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    return 0


COMMAND = Command("peer-env", "create and check an environment of its own with a pinned production library or "
                  "framework", arguments, run)
