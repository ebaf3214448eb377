"""The `kvprobe` command."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvref import GENERATIONS
from kvref.generations import CHIP_NAMES, DEFAULT_GENERATION
from kvref.serving import PRESETS
from probes.iut.peer_env import PEER_ENVS
from probes.run import options
from probes.report.paths import file_safe
from probes.suite.registry import PROBES


def _sharding(value: str):
    from kvref.sharding import Sharding

    try:
        return Sharding.parse(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvprobe", description=(
        "Qualify KV-cache block offload against TPU layouts."))
    sub = parser.add_subparsers(dest="command", required=True)

    ex = sub.add_parser("explain", help="the layout a TPU picks for a shape, and its block slices")
    ex.add_argument("shapes", nargs="+", metavar="SHAPE",
                    help="'bf16[512,3,2048]' (layout from the compiler) or a full XLA layout text")
    ex.add_argument("--generation", "-g", type=options.generations, default=None,
                    help=f"one, several (comma-separated) or 'all' (default {DEFAULT_GENERATION})")
    ex.add_argument("--host-blocks", type=options.positive, default=None,
                    help="host blocks per layer for the host-pool estimate (default: dims[0])")
    ex.add_argument("--layers", type=options.positive, default=1, help="layers for the host-pool estimate")
    ex.add_argument("--sharding", type=_sharding, default=None, metavar="TEXT",
                    help="one device's shard of the cache split this way: 'mesh(model=4) spec(None,None,model)'")
    ex.add_argument("--png", help="draw the physical memory map to this file "
                    "(one shape and generation; use {generation} in the name for several)")
    ex.set_defaults(run=_explain)

    run = sub.add_parser("run", help="run probe cases in watched workers; write CSVs and reports")
    options.add(run, "generation", "iut", "matrix", "probe", "jobs", "timeout")
    run.add_argument("--ray", metavar="ADDRESS", default=None,
                     help="run the cases as tasks of a Ray cluster: 'auto' (the cluster this host "
                     "joined), HOST:PORT, or 'local' (a private one-machine cluster, started and "
                     "stopped by the run); needs `pip install 'kvref[ray]'`")
    options.add(run, "faults", "out")
    run.set_defaults(run=_run)

    rep = sub.add_parser("report", help="rewrite reports from each generation's latest run")
    rep.add_argument("--out", type=Path, default=Path("reports"))
    rep.add_argument("--update-baseline", action="store_true",
                     help="also write each generation's baseline.csv from its latest run")
    rep.set_defaults(run=_report)

    peer = sub.add_parser("peer-env", help="create and check an environment of its own with a "
                          "pinned production library or framework")
    peer.add_argument("--iut", default=None,
                      help="instead: the environment an IUT declares as its interpreter (a PeerEnv)")
    peer.add_argument("--lib", choices=list(PEER_ENVS), default="jax",
                      help="xla: torch_xla 2.9.0 for kvref-torch-xla (lazy tensors on the XLA CPU "
                      "device; about 7 GB); jax: tpu-sync-jax (probed on JAX CPU arrays anywhere); torch: "
                      "tpu-sync-torch with torch and TorchTPU (for a TPU VM)")
    peer.add_argument("--check", action="store_true", help="only check an existing environment")
    peer.set_defaults(run=_peer_env)

    fz = sub.add_parser("fuzz", help="random call sequences against an IUT; shrunk reproducers of "
                        "every kind of failure under <out>/<generation>/findings/")
    fz.add_argument("--iut", default="kvref-sim", help="an IUT, as for `kvprobe run`")
    fz.add_argument("--generation", "-g", default=None,
                    help="its target (default: the IUT's first, e.g. cpu for tpu-sync-jax)")
    fz.add_argument("--sequences", type=options.positive, default=40, help="sequences per way the manager is built")
    fz.add_argument("--seed", type=int, default=0)
    fz.add_argument("--timeout", type=options.positive_number(float), default=60.0, help="seconds per sequence")
    options.add(fz, "faults", "jobs", "out")
    fz.set_defaults(run=_fuzz)

    gens = sub.add_parser("generations", help="the TPU generations shipped, and the TPU types the "
                          "installed libtpu compiles for")
    gens.add_argument("names", nargs="*", metavar="TYPE", help="more TPU types to try (chip or chip:topology)")
    gens.set_defaults(run=_list_generations)

    qual = sub.add_parser("qualify", help="every default probe on a new TPU type and one already "
                          "qualified, and a report of everything that differs")
    qual.add_argument("new", type=_tpu_type, metavar="NEW", help="the new TPU type: v2:2x2, v2, local")
    qual.add_argument("--against", type=_tpu_type, required=True, metavar="OLD",
                      help="a TPU type to compare with, e.g. v3")
    options.add(qual, "matrix", "jobs", "timeout", "out")
    qual.set_defaults(run=_qualify)

    bis = sub.add_parser("bisect", help="the first published build of a library whose verdict on one "
                         "case differs from an older build's")
    bis.add_argument("case", metavar="CASE", help="a case id as in the CSVs: cpu/roundtrip/seed-rank3")
    bis.add_argument("--iut", default="tpu-sync-jax", help="an IUT whose library has builds")
    bis.add_argument("--old", required=True, metavar="VERSION", help="the older build")
    bis.add_argument("--new", required=True, metavar="VERSION", help="the newer build")
    bis.add_argument("--matrix", default="cpu", help="the matrix the case comes from")
    bis.add_argument("--options", default="defaults",
                     help="how the manager is built, as the iut_options column says it")
    options.add(bis, "timeout")
    bis.set_defaults(run=_bisect)

    doc = sub.add_parser("doctor", help="what this machine offers the hardware path, and whether "
                         "`make tpu-test` would fail for the harness's reasons (exit 1)")
    doc.add_argument("--iut", default=None, metavar="IUT",
                     help="only these IUTs (comma-separated; default: every one kvprobe finds)")
    doc.set_defaults(run=_doctor)

    iuts = sub.add_parser("iuts", help="every implementation under test kvprobe can see, where each "
                          "is declared, and why any cannot run here")
    iuts.add_argument("names", nargs="*", metavar="IUT", help="also these (package.module:ATTR)")
    iuts.set_defaults(run=_list_iuts)

    mod = sub.add_parser("model", help="will this model, at this TP degree and block size, offload on "
                         "this TPU: its caches as tpu-inference allocates them, per-shard layouts, host pool, "
                         "and the round trip on them")
    mod.add_argument("model", help=f"a preset ({', '.join(PRESETS)}) or a Hugging Face config.json file")
    mod.add_argument("--dtype", default="bf16", help="cache type: bf16, f8e4m3fn (fp8), f32, ... (default bf16)")
    mod.add_argument("--block-size", type=options.positive, default=16, help="tokens per block (default 16)")
    mod.add_argument("--tp", type=options.positive, default=1, help="tensor-parallel degree: the model axis")
    mod.add_argument("--dp", type=options.positive, default=1, help="data-parallel degree: splits the blocks")
    mod.add_argument("--generation", "-g", type=options.generations, default=[DEFAULT_GENERATION],
                     help=f"one, several (comma-separated) or 'all' (default {DEFAULT_GENERATION})")
    mod.add_argument("--host-blocks", type=options.positive, default=4096,
                     help="host blocks per layer for the host pool (default 4096)")
    mod.add_argument("--iut", default="kvref-sim", help="the implementation the round trip runs on")
    mod.add_argument("--no-probe", action="store_true", help="layouts and host pool only")
    mod.set_defaults(run=_model)

    diff = sub.add_parser("diff", help="what changed between two run CSVs")
    diff.add_argument("a", type=Path)
    diff.add_argument("b", type=Path)
    diff.set_defaults(run=_diff)
    return parser




def _tpu_type(value: str) -> str:
    (name,) = options.generations(value)
    if name == "cpu":
        raise argparse.ArgumentTypeError("expected a TPU type, not 'cpu'")
    return name


def _run(args) -> int:
    from rich.console import Console

    from probes.run import command

    console = Console(stderr=True)
    start = time.monotonic()
    frame = command.run(args.generation, args.iut, args.matrix, args.probe, args.jobs,
                        args.timeout, args.faults, args.out, console, args.ray)
    Console().print(command.summary_table(frame))
    seconds = frame.attrs.get("seconds", {})
    split = f" (runner {seconds['runner']:.1f} s, reports {seconds['reports']:.1f} s)" if seconds else ""
    print(f"{len(frame)} cases in {time.monotonic() - start:.1f} s{split}; reports: {args.out / 'README.md'}")
    return 0


def _list_generations(args) -> int:
    from kvref.generations import DEFAULT_TOPOLOGIES, TOPOLOGIES
    from kvref.oracle import compiler, device_kind

    print("shipped (layouts from the table):")
    for name in GENERATIONS:
        print(f"  {name:8} {TOPOLOGIES[name]:14} {device_kind(name)}")
    print(f"the installed libtpu (a bare chip takes the first of {', '.join(DEFAULT_TOPOLOGIES)} it accepts):")
    for name in dict.fromkeys([*CHIP_NAMES, *args.names]):
        reason = compiler.accepts(name)
        print(f"  {name:14} " + (f"compiles for it: {compiler.device_kind(name)}" if reason is None
                                 else f"no: {reason}"))
    return 0


def _qualify(args) -> int:
    from rich.console import Console

    from probes.run import command

    path, frame = command.qualify(args.new, args.against, args.matrix, args.jobs, args.timeout, args.out,
                                  Console(stderr=True))
    print(f"{len(frame)} cases; qualification report: {path}")
    return 0


def _bisect(args) -> int:
    from probes.iut.registry import iut
    from probes.run.bisect import bisect_case
    from probes.suite.matrix import build_cases, load_matrix

    declared = iut(args.iut)
    generation = args.case.split("/", 1)[0]
    cases = [c for c in build_cases([generation], load_matrix(args.matrix), tuple(PROBES), args.iut,
                                    timeout=args.timeout)
             if c.case_id == args.case and c.options_text == args.options]
    if not cases:
        raise ValueError(f"no case {args.case!r} built {args.options!r} for {args.iut} in matrix "
                         f"{args.matrix!r}; case ids look like cpu/roundtrip/seed-rank3")
    found = bisect_case(cases[0], declared.library.distribution, args.old, args.new,
                        progress=lambda v, o: print(f"  {v}: {o.verdict}", flush=True))
    if found.after is None:
        print(f"no build from {args.old} to {args.new} changed the verdict "
              f"({found.steps[0].outcome.verdict} at both ends)")
        return 0
    for label, step in (("last without the new verdict", found.before), ("first with it", found.after)):
        print(f"{label}: {step.build}: {step.outcome.verdict}: {step.outcome.detail.strip()[:1500]}")
    return 0


def _peer_env(args) -> int:
    from probes.iut import peer_env
    from probes.iut.registry import iut

    env = peer_env.peer_env(args.lib) if args.iut is None else peer_env.declared_env(iut(args.iut).interpreter)
    if env is None:
        raise ValueError(f"{args.iut} runs in {iut(args.iut).interpreter}, not an environment kvprobe builds")
    if args.check:
        python = env.python()
        if python is None:
            raise ValueError(env.missing())
        found = peer_env.verify(env, python)
    else:
        found = peer_env.create(env)
    print(f"{env.name} peer environment ok: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    return 0


def _report(args) -> int:
    from probes.run import command

    frames = command.write_reports(args.out)
    print(f"reports for {', '.join(frames)} in {args.out}")
    if args.update_baseline:
        for path in command.update_baselines(args.out, frames):
            print(f"baseline: {path}")
    return 0


def _fuzz(args) -> int:
    import kvref
    from probes.run import fuzz_command

    from probes.iut.registry import iut

    generation = args.generation or iut(args.iut).targets[0]
    results, findings = fuzz_command.fuzz_iut(args.iut, generation, args.sequences, args.seed,
                                              kvref.Faults.parse(args.faults, environ={}), args.timeout,
                                              args.jobs, args.out)
    print(fuzz_command.summary(results, findings))
    return 1 if findings else 0


def _doctor(args) -> int:
    from probes.run.doctor import diagnose

    found = diagnose([n for n in args.iut.split(",") if n] if args.iut else None)
    print("\n".join(found.lines))
    return 1 if found.problems else 0


def _list_iuts(args) -> int:
    from probes.run.iuts_command import listing

    print(listing(args.names))
    return 0


def _diff(args) -> int:
    from probes.report import diff, results

    for path in (args.a, args.b):
        if not path.exists():
            raise ValueError(f"no such run file: {path}")
    changes = diff.diff_runs(results.read_run(args.a), results.read_run(args.b))
    if changes.empty:
        print("no differences")
        return 0
    print(changes.to_markdown(index=False))
    return 1


def _model(args) -> int:
    from rich.console import Console

    from probes.iut.registry import iut
    from probes.run import model_command

    cache = model_command.model_cache(args.model, args.dtype, args.block_size, args.tp, args.dp)
    for gen in args.generation:
        iut(args.iut).check_target(gen)
    facts = [model_command.shard_facts(cache, gen, args.iut) for gen in args.generation]
    results = [] if args.no_probe else model_command.probe_caches(
        cache, f"{cache.model.name}-bs{args.block_size}-tp{args.tp}-dp{args.dp}", args.generation, args.iut)
    Console().print(model_command.render(cache, facts, results, args.host_blocks))
    return 0 if model_command.all_agree(results) else 1


def _explain(args) -> int:
    from probes.report import explain, memory_map

    gens = args.generation or [DEFAULT_GENERATION]
    # A full layout text does not depend on the generation: explain it once.
    jobs = [(text, None if "{" in text else gen) for text in args.shapes
            for gen in (gens[:1] if "{" in text else gens)]
    if args.png and len(jobs) > 1 and not any(k in args.png for k in ("{generation}", "{shape}")):
        raise ValueError("--png with several shapes or generations needs {generation} or {shape} "
                         "in the file name")
    for text, gen in jobs:
        e = explain.explain(text, gen, args.host_blocks, args.layers, args.sharding)
        print(explain.render(e) + "\n")
        if args.png:
            path = args.png.format(generation=gen or "given", shape=file_safe(str(e.shape)))
            memory_map.draw(e.shape, path, title=e.slices.reason or "addressable",
                            remedy=(f"remedy: {e.remedy.change}", e.remedy.shape) if e.remedy else None)
            print(f"  memory map      {path}\n")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"kvprobe: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C: one line, the shell's code for SIGINT
        finished = getattr(e, "finished", None)
        kept = "" if finished is None else \
            f"; {len(finished)} finished cases kept as run {getattr(e, 'run_id', '(unwritten)')}" if finished \
            else "; no case had finished"
        print(f"kvprobe: interrupted{kept}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
