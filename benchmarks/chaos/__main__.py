"""``python -m benchmarks.chaos``: run the scenarios from the command line (see the package
docs)."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from benchmarks.chaos.busy_storm import busy_storm
from benchmarks.chaos.harness import ROOT
from benchmarks.chaos.harness import SCENARIOS
from benchmarks.chaos.harness import ChaosError
from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.harness import backend_of
from benchmarks.chaos.kill_storm import kill_storm
from benchmarks.chaos.outage import outage
from benchmarks.chaos.paused_worker import paused_worker
from benchmarks.chaos.poison_pills import poison_pills
from benchmarks.chaos.sigterm import sigterm


def header(argv: Sequence[str], url: str) -> str:
    cores = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if commit and subprocess.run([*git, "diff-index", "--quiet", "HEAD", "--"]).returncode:
        commit += " + uncommitted changes"
    import flask_sqlqueue

    shown = sa.make_url(url).render_as_string(hide_password=True)
    if backend_of(url) == "sqlite":
        shown += "` (a fresh file per scenario in the work directory; the path is not used)"
    else:
        shown += "` (a fresh database per scenario, created and dropped by the script)"
    return "\n".join(
        [
            "# flask_sqlqueue chaos figures",
            "",
            f"- command: `{shlex.join(['python', '-m', 'benchmarks.chaos', *argv])}`",
            f"- database: `{shown}",
            f"- machine: {cores or os.cpu_count()} cores (`nproc`), {platform.machine()}, "
            f"{platform.system()} {platform.release()}",
            f"- Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
            f"SQLAlchemy {sa.__version__}, flask_sqlqueue {flask_sqlqueue.__version__}"
            + (f" (commit {commit})" if commit else ""),
            f"- started: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            "",
        ]
    )


def run(name: str, args: argparse.Namespace, workdir: Path) -> ScenarioResult:
    url = args.database_url
    if name == "kill-storm":
        return kill_storm(
            url,
            workdir,
            jobs=args.jobs,
            duration=args.duration,
            workers=args.workers,
            threads=args.threads,
            kill_every=args.kill_every,
            target=args.kill_target,
            job_ms=args.job_ms,
            stale_after=args.stale_after,
            seed=args.seed,
            graph=args.graph,
            signal_name=args.signal,
            grace=args.grace,
            long_share=args.long_share,
        )
    if name == "paused":
        return paused_worker(url, workdir, stale_after=args.stale_after)
    if name == "sigterm":
        return sigterm(url, workdir, stale_after=args.stale_after)
    if name == "poison":
        return poison_pills(
            url,
            workdir,
            healthy=args.healthy,
            workers=args.workers,
            threads=args.threads,
            stale_after=args.stale_after,
        )
    if name == "busy":
        return busy_storm(
            url,
            workdir,
            producers=args.producers,
            per_producer=args.enqueues,
            workers=args.workers,
            threads=args.threads,
        )
    if name == "outage":
        return outage(
            url,
            workdir,
            seconds=args.outage,
            workers=args.workers,
            threads=args.threads,
            stale_after=args.stale_after,
        )
    raise ValueError(name)


def _millis(text: str) -> tuple[float, float]:
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"LOW,HIGH milliseconds, not {text!r}") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"0 <= LOW <= HIGH, not {text!r}")
    return (low, high)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos",
        description="Chaos scenarios against real flask queue workers.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--database-url", required=True, help="sqlite:///... or a server URL")
    parser.add_argument("--duration", type=float, default=60.0, help="kill-storm window (s)")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--jobs", type=int, default=2000, help="kill-storm jobs")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kill-every", type=float, default=0.5, help="kill-storm period (s)")
    parser.add_argument(
        "--job-ms",
        type=_millis,
        default=(20.0, 200.0),
        help="kill-storm job length, LOW,HIGH milliseconds (20,200); a few ms each makes "
        "the workers claim ahead",
    )
    parser.add_argument(
        "--kill-target",
        choices=["any", "ready"],
        help="kill-storm victims: any worker process (the default with --signal kill), or "
        "only workers that have started (the default, and the only choice, with --signal term)",
    )
    parser.add_argument(
        "--signal",
        choices=["kill", "term"],
        default="kill",
        help="kill-storm signal: SIGKILL and restart (kill), or a SIGTERM storm (term): a "
        "graceful stop, a replacement spawned at once; adds jobs longer than --grace",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=2.0,
        help="kill-storm workers' --grace (s); each SIGTERMed worker must exit within it + 5 s",
    )
    parser.add_argument(
        "--long-share",
        type=float,
        metavar="SHARE",
        help="kill-storm: share of the jobs lasting 1.5-3 x --grace (default 0.05 with "
        "--signal term, else 0)",
    )
    parser.add_argument(
        "--graph",
        type=int,
        default=0,
        metavar="N",
        help="kill-storm over a graph: each job depends on 0-N of the 50 jobs before it "
        "(0: independent jobs)",
    )
    parser.add_argument("--stale-after", type=float, default=2.0, help="SQLQUEUE_STALE_AFTER")
    parser.add_argument("--healthy", type=int, default=200, help="poison: healthy jobs")
    parser.add_argument("--producers", type=int, default=4, help="busy: producer processes")
    parser.add_argument("--enqueues", type=int, default=2500, help="busy: enqueues each")
    parser.add_argument("--outage", type=float, default=10.0, help="outage length (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="keep logs and side files here")
    args = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    if backend_of(args.database_url) not in ("sqlite", "postgresql", "mysql"):
        parser.error("--database-url must be sqlite, postgresql or mysql/mariadb")
    if args.signal == "term" and args.kill_target == "any":
        parser.error("--signal term stops only workers that have started (--kill-target ready)")
    if args.long_share is not None and not 0 <= args.long_share <= 1:
        parser.error("--long-share must be within 0-1")

    keep = args.workdir is not None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sqlqueue-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(header(argv, args.database_url), flush=True)
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    failed = False
    for name in names:
        try:
            result = run(name, args, workdir)
        except ChaosError as exc:
            result = ScenarioResult(name, backend_of(args.database_url))
            result.violations.append(f"the harness could not run the scenario: {exc}")
        print(result.markdown(), flush=True)
        failed = failed or not result.ok
    if failed or keep:
        print(f"Logs and side files: {workdir}", flush=True)
    else:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
