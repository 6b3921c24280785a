"""The report: section 1, every system at its defaults, and flask_sqlqueue's targets;
section 2, the matched settings at each concurrency; how each system ran; the errors."""

from __future__ import annotations

from dataclasses import dataclass

from .harness import PROBE_GAP
from .harness import Results
from .harness import Sizes
from .systems import DEFAULTS
from .systems import Setting
from .systems import System

STORES = ("SQLite", "PostgreSQL", "MariaDB")
FSQ = {
    "SQLite": "flask_sqlqueue-sqlite",
    "PostgreSQL": "flask_sqlqueue-pg",
    "MariaDB": "flask_sqlqueue-mysql",
}
RAW = {"SQLite": "raw-sqlite", "PostgreSQL": "raw-psycopg", "MariaDB": "raw-pymysql"}
# Columns of words, aligned left; the others hold figures.
LEFT = frozenset(
    [
        *"system store how axis target goal status logging notes versions".split(),
        *("best peer, same store", "best peer, any store", "worker command"),
    ]
)


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "—"
    return f"{value / base:.2f}x"


@dataclass(frozen=True)
class Goal:
    """A target of flask_sqlqueue's at the defaults: a figure ÷ another system's (or its
    own) in the same run, or without ``over`` the figure itself, against ``bound``."""

    label: str
    figure: tuple[str, str]  # (system, metric)
    over: tuple[str, str] | None
    bound: float
    at_least: bool = True  # met when ≥ bound; else when ≤ bound
    reported: bool = False  # no goal: ``bound`` is the long-run aim
    unit: str = "x"

    @property
    def goal(self) -> str:
        shown = f"{'≥' if self.at_least else '≤'} {self.bound:g}{self.unit}"
        return f"reported (aim {shown})" if self.reported else shown

    def systems(self) -> set[str]:
        return {self.figure[0], *(self.over[:1] if self.over else ())}


def _over(label: str, metric: str, fsq: str, other: str, bound: float) -> Goal:
    """flask_sqlqueue's ``metric`` ÷ ``other``'s at least ``bound`` (rates)."""
    return Goal(label, (fsq, metric), (other, metric), bound, at_least=True)


def _under(label: str, metric: str, fsq: str, other: str, bound: float) -> Goal:
    """flask_sqlqueue's ``metric`` ÷ ``other``'s at most ``bound`` (latency, memory)."""
    return Goal(label, (fsq, metric), (other, metric), bound, at_least=False)


#: The rates of flask_sqlqueue reported against its raw ceiling.
RATES = (
    ("enqueue", "one-commit enqueue"),
    ("drain1", "drain from spawn"),
    ("steady1", "steady drain"),
    ("drain2", "drain from spawn, 2 processes"),
)


def _goals() -> list[Goal]:
    pg, lite = FSQ["PostgreSQL"], FSQ["SQLite"]
    goals = [
        _over("PostgreSQL drain from spawn ÷ PgQueuer's", "drain1", pg, "pgqueuer", 1.5),
        Goal("PostgreSQL drain from spawn, 2 processes ÷ 1", (pg, "drain2"), (pg, "drain1"), 1.5),
        _over("PostgreSQL one-commit enqueue ÷ PgQueuer's", "enqueue", pg, "pgqueuer", 1.0),
        _over("SQLite drain from spawn ÷ Huey's", "drain1", lite, "huey-sqlite", 2.0),
        _over("SQLite one-commit enqueue ÷ Huey's", "enqueue", lite, "huey-sqlite", 1.0),
    ]
    goals += [
        _under(f"{store} pickup p50 ÷ the raw loop's", "p50", FSQ[store], RAW[store], 1.25)
        for store in STORES
    ]
    goals += [
        Goal(f"{store} first job after spawn", (FSQ[store], "first1"), None, 0.5, False, unit=" s")
        for store in STORES
    ]
    goals += [
        _under("SQLite worker RSS ÷ Huey's", "rss", lite, "huey-sqlite", 1.0),
        _under("PostgreSQL worker RSS ÷ Huey's (SQLite)", "rss", pg, "huey-sqlite", 1.0),
    ]
    goals += [
        Goal(
            f"{store} {label} ÷ {RAW[store]}",
            (FSQ[store], metric),
            (RAW[store], metric),
            0.5,
            reported=True,
        )
        for store in STORES
        for metric, label in RATES
    ]
    return goals


@dataclass(frozen=True)
class Axis:
    """One line of the matched section's summary: a metric, and which way is better."""

    metric: str
    label: str
    digits: int = 0
    lower_is_better: bool = False


AXES = (
    Axis("steady1", "drain, 1 process (jobs/s)"),
    Axis("steady2", "drain, 2 processes (jobs/s)"),
    Axis("bulk", "bulk enqueue (jobs/s)"),
    Axis("rss", "worker peak RSS (MiB)", 1, lower_is_better=True),
    Axis("p50", "pickup latency p50 (ms)", 1, lower_is_better=True),
)


class _Report:
    """The report's tables, read from the medians of ``results``."""

    def __init__(
        self, results: Results, systems: list[System], sizes: Sizes, concurrencies: list[int]
    ) -> None:
        self.results = results
        self.systems = systems
        self.sizes = sizes
        self.concurrencies = concurrencies
        self.out: list[str] = []

    def med(self, name: str | None, metric: str, setting: Setting) -> float | None:
        return self.results.median(name, metric, setting)

    def of_kind(self, kind: str, store: str) -> str | None:
        """The flask_sqlqueue system ("sqlqueue") or the ceiling ("ceiling") on ``store``."""
        return next((s.name for s in self.systems if s.kind == kind and s.store == store), None)

    def over(self, system: System, metric: str, setting: Setting, kind: str) -> str:
        """The figure ÷ the raw ceiling's (``ceiling``) or flask_sqlqueue's (``sqlqueue``)
        on its store."""
        base = self.med(self.of_kind(kind, system.store), metric, setting)
        return _ratio(self.med(system.name, metric, setting), base)

    def rate(self, name: str, metric: str, setting: Setting) -> str:
        """A rate, marked ``*`` if the drain was capped and ``≥`` if it is a lower bound."""
        cell = _fmt(self.med(name, metric, setting))
        if cell == "—":
            return cell
        marks = self.results.marks_of(name, metric, setting)
        if "lower bound" in marks:
            cell = f"≥ {cell}"
        return f"{cell} *" if marks - {"lower bound"} else cell

    def table(self, title: str, note: str, columns: list[str], rows: list[list[str]]) -> None:
        self.out.extend([f"### {title}", "", note, ""] if note else [f"### {title}", ""])
        self.out.append("| " + " | ".join(columns) + " |")
        self.out.append("|" + "|".join("---" if c in LEFT else "---:" for c in columns) + "|")
        self.out.extend("| " + " | ".join(row) + " |" for row in rows)
        self.out.append("")

    # -- section 1 ------------------------------------------------------------------------

    def defaults(self) -> None:
        jobs, samples = f"{self.sizes.jobs:,}", self.sizes.samples
        self.out += [
            "## 1. At the defaults",
            "",
            "Each system's worker started with exactly the command its users type, nothing "
            "tuned (the commands are below). The job is `write(i=..., email=...)`, which "
            "appends one line to a file; a job is finished when its line is in the file, "
            "counted the same way for every system.",
            "",
            f"- *enqueue*: {jobs} jobs, one per transaction, each with the system's own call "
            "(flask_sqlqueue: `write.enqueue(i=..., email=...)` in an app context of its own, "
            "as a web request makes it); the timed fill of the queue before each drain.",
            f"- *drain from spawn*: {jobs} ÷ (the moment the last job's line is in the file - "
            "the moment the worker process was spawned): start-up included. *steady*: from "
            "the first finished job to the last. *first job*: seconds from the spawn to the "
            "first line. *2 proc.*: two worker processes spawned together, from spawn.",
            f"- *pickup*: one idle worker, {samples} probe jobs one at a time, each enqueued "
            f"{PROBE_GAP * 1000:.0f} ms after the previous one started: from just before the "
            "enqueue call to the job's start, as the job records it. The raw ceilings' loop "
            "waits on `LISTEN` on PostgreSQL (the raw producer's insert sends `NOTIFY` in its "
            "transaction) and claims again every 1 ms on SQLite and MariaDB.",
            "- *RSS*: the peak resident set (VmHWM) of the worker process and every process "
            "it forked, during the 1-process drain.",
            "- Durability as each system leaves it: flask_sqlqueue on SQLite commits with "
            "`synchronous=FULL` (its default); Huey's `PRAGMA synchronous`, as read from its "
            "own connection, is in its note below.",
            "- *÷ fsq*: the figure ÷ flask_sqlqueue's on the same store. `*`: the drain was "
            f"stopped {self.sizes.drain_cap:g} s after the spawn, the rate is over the jobs "
            "it finished; `≥`: every job finished between two counts.",
            "",
        ]
        self.defaults_table()
        self.targets()
        self.commands_at_defaults()

    def defaults_row(self, s: System) -> list[str]:
        d, med = DEFAULTS, self.med
        return [
            s.name,
            s.store,
            self.rate(s.name, "enqueue", d),
            self.over(s, "enqueue", d, "sqlqueue"),
            self.rate(s.name, "drain1", d),
            self.over(s, "drain1", d, "sqlqueue"),
            self.rate(s.name, "steady1", d),
            self.over(s, "steady1", d, "sqlqueue"),
            self.rate(s.name, "drain2", d),
            _ratio(med(s.name, "drain2", d), med(s.name, "drain1", d)),
            _fmt(med(s.name, "first1", d), 2),
            _fmt(med(s.name, "p50", d), 1),
            _fmt(med(s.name, "p95", d), 1),
            _fmt(med(s.name, "rss", d), 1),
        ]

    def defaults_table(self) -> None:
        self.table(
            f"Every system at its defaults ({self.sizes.jobs:,} jobs)",
            "",
            [
                "system",
                "store",
                "enqueue (jobs/s)",
                "÷ fsq",
                "drain from spawn (jobs/s)",
                "÷ fsq",
                "steady (jobs/s)",
                "÷ fsq",
                "2 proc. from spawn (jobs/s)",
                "2 ÷ 1",
                "first job (s)",
                "pickup p50 (ms)",
                "p95 (ms)",
                "RSS (MiB)",
            ],
            [self.defaults_row(s) for s in self.systems],
        )

    def goal_row(self, goal: Goal) -> list[str]:
        value = self.med(goal.figure[0], goal.figure[1], DEFAULTS)
        if goal.over is not None and value is not None:
            base = self.med(goal.over[0], goal.over[1], DEFAULTS)
            value = value / base if base else None
        if value is None:
            return [goal.label, goal.goal, "—", "no figure"]
        shown = f"{value:.2f}{goal.unit}"
        met = value >= goal.bound if goal.at_least else value <= goal.bound
        status = "reported" if goal.reported else "met" if met else "**not met**"
        return [goal.label, goal.goal, shown, status]

    def targets(self) -> None:
        names = {s.name for s in self.systems}
        self.table(
            "flask_sqlqueue's targets, at the defaults",
            "Each a ratio of figures of the table above (the same run), or a figure itself.",
            ["target", "goal", "value", "status"],
            [self.goal_row(goal) for goal in _goals() if goal.systems() <= names],
        )

    def commands_at_defaults(self) -> None:
        self.table(
            "How each system ran at the defaults",
            "",
            ["system", "store", "worker command", "logging", "notes", "versions"],
            [
                [
                    s.name,
                    s.store,
                    f"`{s.command(DEFAULTS)}`",
                    s.logging(DEFAULTS),
                    s.note(DEFAULTS),
                    s.versions(),
                ]
                for s in self.systems
            ],
        )

    # -- section 2 ------------------------------------------------------------------------

    def matched(self) -> None:
        levels = ", ".join(str(c) for c in self.concurrencies)
        self.out += [
            "## 2. At matched settings",
            "",
            f"Each system tuned as its docs recommend for throughput, at each concurrency "
            f"({levels}) where it has the setting, named on every row of the commands below; "
            "every worker's logging quiet (warnings and errors); durability matched: Huey "
            "with `fsync=True` (`PRAGMA synchronous=FULL`, flask_sqlqueue's default on "
            f"SQLite). Each queue is filled with {self.sizes.jobs:,} jobs by the system's "
            "bulk enqueue (timed: *bulk enqueue*). Drain rates here run from the first "
            "finished job to the last, start-up excluded; counted in the output file as "
            "above.",
            "",
        ]
        self.summary()
        self.bulk()
        for c in self.concurrencies:
            self.at_concurrency(c)
        self.commands_matched()

    def best_peer(self, axis: Axis, setting: Setting, store: str | None) -> str:
        found = [
            (value, s.name)
            for s in self.systems
            if s.kind == "peer" and store in (None, s.store)
            if (value := self.med(s.name, axis.metric, setting)) is not None
        ]
        if not found:
            return ""
        return (min if axis.lower_is_better else max)(found)[1]

    def summary_row(self, axis: Axis, sq: System, c: int) -> list[str]:
        setting = Setting(matched=True, concurrency=c)
        value = self.med(sq.name, axis.metric, setting)
        row = [axis.label, sq.store, str(c), _fmt(value, axis.digits)]
        for store in (sq.store, None):
            peer = self.best_peer(axis, setting, store)
            other = self.med(peer or None, axis.metric, setting)
            row += [f"{_fmt(other, axis.digits)} {peer}" if peer else "—", _ratio(value, other)]
        raw = self.med(self.of_kind("ceiling", sq.store), axis.metric, setting)
        return [*row, _fmt(raw, axis.digits), _ratio(value, raw)]

    def summary(self) -> None:
        self.table(
            "Matched settings, summary: flask_sqlqueue, the best peer, the raw ceiling",
            "Every ratio is flask_sqlqueue's figure ÷ the other's, so above 1 is better for "
            "rates and below 1 is better for RSS and latency. No peer runs on MariaDB.",
            [
                "axis",
                "store",
                "concurrency",
                "flask_sqlqueue",
                "best peer, same store",
                "÷",
                "best peer, any store",
                "÷",
                "raw ceiling",
                "÷",
            ],
            [
                self.summary_row(axis, sq, c)
                for axis in AXES
                for sq in self.systems
                if sq.kind == "sqlqueue"
                for c in self.concurrencies
            ],
        )

    def bulk(self) -> None:
        settings = [Setting(matched=True, concurrency=c) for c in self.concurrencies]
        self.table(
            f"Bulk enqueue ({self.sizes.jobs:,} jobs, jobs/s)",
            "The median of the fills before the drains at each concurrency; ÷ raw and ÷ fsq "
            "at the last concurrency.",
            [
                "system",
                "store",
                *(f"concurrency {c}" for c in self.concurrencies),
                "÷ raw",
                "÷ fsq",
                "how",
            ],
            [
                [
                    s.name,
                    s.store,
                    *(self.rate(s.name, "bulk", setting) for setting in settings),
                    self.over(s, "bulk", settings[-1], "ceiling"),
                    self.over(s, "bulk", settings[-1], "sqlqueue"),
                    s.bulk_note,
                ]
                for s in self.systems
            ],
        )

    def drain_row(self, s: System, setting: Setting) -> list[str]:
        return [
            s.name,
            s.store,
            self.rate(s.name, "steady1", setting),
            self.rate(s.name, "steady2", setting),
            _ratio(self.med(s.name, "steady2", setting), self.med(s.name, "steady1", setting)),
            self.over(s, "steady1", setting, "ceiling"),
            self.over(s, "steady2", setting, "ceiling"),
            self.over(s, "steady1", setting, "sqlqueue"),
            self.over(s, "steady2", setting, "sqlqueue"),
        ]

    def at_concurrency(self, c: int) -> None:
        setting = Setting(matched=True, concurrency=c)
        once = ", ".join(s.name for s in self.systems if not s.concurrent)
        same = f" {once}: no concurrency setting, the same figures at every one." if once else ""
        polls = (
            " On MariaDB an idle flask_sqlqueue worker on the producer's host is woken by a "
            "same-host socket (MariaDB has no NOTIFY); one on another host would poll, every "
            "`--poll-interval` (1 s by default)."
            if any(s.kind == "sqlqueue" and s.store == "MariaDB" for s in self.systems)
            else ""
        )
        self.table(
            f"Drain a pre-filled queue of {self.sizes.jobs:,} jobs at concurrency {c} (jobs/s)",
            "From the first finished job to the last; `*`: stopped "
            f"{self.sizes.drain_cap:g} s after the spawn, rate over the jobs it finished; "
            "`≥`: drained between two counts, too fast to time at this size; "
            "÷ raw and ÷ fsq: over the raw ceiling and flask_sqlqueue on the same store." + same,
            [
                "system",
                "store",
                "1 process",
                "2 processes",
                "2 ÷ 1",
                "1 proc ÷ raw",
                "2 proc ÷ raw",
                "1 proc ÷ fsq",
                "2 proc ÷ fsq",
            ],
            [self.drain_row(s, setting) for s in self.systems],
        )
        self.table(
            f"Pickup latency, idle worker at concurrency {c} "
            f"({self.sizes.samples} jobs one at a time, ms)",
            "From just before the enqueue call to the job's start, as at the defaults." + polls,
            ["system", "store", "p50", "p95", "p99", "p50 ÷ raw", "p50 ÷ fsq"],
            [
                [
                    s.name,
                    s.store,
                    *(_fmt(self.med(s.name, f"p{p}", setting), 1) for p in (50, 95, 99)),
                    self.over(s, "p50", setting, "ceiling"),
                    self.over(s, "p50", setting, "sqlqueue"),
                ]
                for s in self.systems
            ],
        )
        self.table(
            f"Peak RSS of a worker process at concurrency {c} (MiB)",
            "VmHWM of the process (and any children it forked) during the 1-process drain.",
            ["system", "store", "MiB", "÷ raw", "÷ fsq"],
            [
                [
                    s.name,
                    s.store,
                    _fmt(self.med(s.name, "rss", setting), 1),
                    self.over(s, "rss", setting, "ceiling"),
                    self.over(s, "rss", setting, "sqlqueue"),
                ]
                for s in self.systems
            ],
        )

    def command_rows(self, s: System) -> list[list[str]]:
        if not s.concurrent:
            setting = Setting(matched=True)
            return [[s.name, s.concurrency_note, *self.command_cells(s, setting)]]
        return [
            [s.name, str(c), *self.command_cells(s, Setting(matched=True, concurrency=c))]
            for c in self.concurrencies
        ]

    def command_cells(self, s: System, setting: Setting) -> list[str]:
        return [f"`{s.command(setting)}`", s.logging(setting), s.note(setting), s.versions()]

    def commands_matched(self) -> None:
        notes = [
            f"- {s.name}: {s.concurrency_note}"
            for s in self.systems
            if s.concurrent and s.concurrency_note
        ]
        self.table(
            "How each system ran at matched settings",
            "\n".join(notes),
            ["system", "concurrency", "worker command", "logging", "notes", "versions"],
            [row for s in self.systems for row in self.command_rows(s)],
        )


def report(
    results: Results,
    systems: list[System],
    sizes: Sizes,
    runs: int,
    sections: list[str],
    concurrencies: list[int],
    header: list[str],
) -> str:
    r = _Report(results, systems, sizes, concurrencies)
    r.out.extend([*header, ""])
    if "defaults" in sections:
        r.defaults()
    if "matched" in sections:
        r.matched()
    r.out.append(
        f"Medians of {runs} run(s). Every figure is checked against a count: each fill is "
        "counted waiting in the system's own store; after each drain the output file must "
        "hold one line per job, every enqueued job's `i` once and no other (a drain stopped "
        "at its cap: no job twice); every probe must have run exactly once. A run whose "
        "count is wrong is listed below as an error and gives no figure."
    )
    r.out.append("")
    errors = [
        f"- {name} / {step}: {message}"
        for (name, step), messages in sorted(results.errors.items())
        for message in messages
    ]
    r.out.extend(["### Errors", "", *(errors or ["none"]), ""])
    return "\n".join(r.out)
