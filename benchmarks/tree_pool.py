"""``--baseline PATH``: our package from another source tree, in processes of its own.

Shared by ``bench_locks.py`` (sync) and ``bench_async.py`` (asyncio). Both trees'
package is named ``django_redislock``, so the two cannot share a process: each tree
gets one *spawned* process with its tree first on ``sys.path`` (``TREE_ENV``), which
configures Django, forks its own worker pool and runs the uncontended operations
itself; the parent routes ``ours@current`` / ``ours@baseline`` to it (``REMOTE``,
``route``) and sends it the same commands it sends its own pool.

Importing this module puts ``$BENCH_REDISLOCK_TREE`` first on ``sys.path`` (the
variable is set only in the environment of the spawned tree processes), so the
benchmark scripts import it before anything imports ``django_redislock``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The source tree whose django_redislock this process imports. Set by the parent in
#: the environment of the spawned tree processes only (see TreePool).
TREE_ENV = "BENCH_REDISLOCK_TREE"
if os.environ.get(TREE_ENV) and sys.path[:1] != [os.environ[TREE_ENV]]:
    sys.path.insert(0, os.environ[TREE_ENV])

CURRENT = "ours@current"
BASELINE = "ours@baseline"

#: Library keys run in a TreePool -> (that pool, the key run inside it). ``ours@current``
#: and ``ours@baseline`` are both ``ours`` run the same way (a spawned process per
#: source tree that forks its own workers), so their ratio is fair.
REMOTE: dict[str, tuple[TreePool, str]] = {}


def route(pool: Any, lib_key: str) -> tuple[Any, str]:
    """The pool that runs *lib_key* (*pool*, or its tree's) and the library key to send it."""
    return REMOTE.get(lib_key, (pool, lib_key))


def add_argument(ap: argparse.ArgumentParser) -> None:
    """Add the ``--baseline PATH`` option to *ap*."""
    ap.add_argument(
        "--baseline",
        metavar="PATH",
        default=None,
        help="also run 'ours' from the source tree at PATH (a git worktree of an older "
        "commit) as ours@baseline, and from this tree the same way as ours@current, "
        "in every selected experiment (see benchmarks/README.md)",
    )


def baseline_path(ap: argparse.ArgumentParser, value: str | None) -> Path | None:
    """The resolved ``--baseline`` tree, or None; *ap* errors out if it has no package."""
    if value is None:
        return None
    path = Path(value).resolve()
    if not (path / "django_redislock" / "__init__.py").is_file():
        ap.error(f"--baseline {path}: no django_redislock package there")
    return path


def tree_commit(tree: Path) -> dict[str, Any]:
    """*tree*'s short commit, subject and uncommitted changes under django_redislock/."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tree), *args], capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        return {
            "commit": git("rev-parse", "--short", "HEAD"),
            "subject": git("log", "-1", "--format=%s")[:120],
            "uncommitted_package_changes": git(
                "status", "--porcelain", "--", "django_redislock"
            ).splitlines(),
        }
    except Exception as exc:
        return {"error": str(exc)}


def serve(conn: Any, pool: Any, handlers: dict[str, Callable[..., Any]]) -> None:
    """A tree process's command loop, until ``exit`` (or an idle day); closes *pool*.

    ``hello`` says where django_redislock came from; ``pool`` relays a command list
    to *pool* (the tree's own worker pool, with ``run(cmds, timeout, clear_events)``);
    any other op calls ``handlers[op](**cmd)``. An exception is sent back as
    ``{"error": ...}``.
    """
    import django_redislock

    try:
        while True:
            if not conn.poll(24 * 3600):
                return
            cmd = conn.recv()
            op = cmd.pop("op")
            if op == "exit":
                return
            try:
                if op == "hello":
                    res: Any = {
                        "file": django_redislock.__file__,
                        "pid": os.getpid(),
                        "workers": len(pool.conns) if pool is not None else 0,
                    }
                elif op == "pool" and pool is not None:
                    res = pool.run(cmd["cmds"], cmd["timeout"], clear_events=cmd["clear_events"])
                elif op in handlers:
                    res = handlers[op](**cmd)
                else:
                    res = {"error": f"unknown op {op}"}
            except Exception as exc:
                res = {"error": f"{type(exc).__name__}: {exc}"}
            conn.send(res)
    finally:
        if pool is not None:
            pool.close()


class TreePool:
    """Runs our library from another source tree, in processes of its own.

    One process is *spawned* (not forked: the package is already imported here)
    with *tree* first on sys.path, running ``target(conn, *args)`` (the script's
    ``tree_main``: configure Django, fork the workers, then ``serve``). Used for
    ``ours@baseline`` and, the same way, for ``ours@current``, so that both run
    under the same process model.
    """

    def __init__(self, tree: Path, target: Callable[..., None], *args: Any) -> None:
        ctx = mp.get_context("spawn")
        self.tree = tree.resolve()
        self.conn, child = ctx.Pipe()
        old = os.environ.get(TREE_ENV)
        os.environ[TREE_ENV] = str(self.tree)
        try:
            # Not a daemon: it forks workers of its own. close() ends it.
            self.proc = ctx.Process(target=target, args=(child, *args))
            self.proc.start()
        finally:
            if old is None:
                del os.environ[TREE_ENV]
            else:
                os.environ[TREE_ENV] = old
        child.close()
        hello = self._call({"op": "hello"}, timeout=120)
        self.package_file = hello["file"]
        if not Path(self.package_file).resolve().is_relative_to(self.tree):
            self.close()
            raise SystemExit(
                f"the process for {tree} imported django_redislock from {self.package_file}"
            )
        self.info: dict[str, Any] = {"tree": str(self.tree), "package_file": self.package_file}
        self.info.update(tree_commit(self.tree))

    def _call(self, cmd: dict[str, Any], timeout: float) -> Any:
        self.conn.send(cmd)
        if not self.conn.poll(timeout):
            raise RuntimeError(f"the process for {self.tree} did not answer in time")
        res = self.conn.recv()
        if isinstance(res, dict) and set(res) == {"error"}:
            raise RuntimeError(f"{self.tree}: {res['error']}")
        return res

    def uncontended(
        self, lib_key: str, name: str, count: int, untimed: int = 1
    ) -> list[tuple[float, float]]:
        """*count* uncontended operations timed in the tree process: (wall us, CPU us) each.

        *untimed* operations run first, untimed: the batch then starts after the process
        woke up on the pipe (cold caches), the same in every tree. 0 where every
        operation must count (the Redis commands per operation pass).
        """
        got = self._call(
            {
                "op": "uncontended",
                "lib_key": lib_key,
                "name": name,
                "count": count,
                "untimed": untimed,
            },
            timeout=60 + (count + untimed) * 0.1,
        )
        return [(float(w), float(c)) for w, c in got]

    def python_calls(self, lib_key: str, name: str) -> dict[str, int]:
        """Python function calls of one uncontended operation in the tree process (see
        ``bench_locks.python_calls``)."""
        got = self._call({"op": "calls", "lib_key": lib_key, "name": name}, timeout=60)
        return {str(k): int(v) for k, v in got.items()}

    def run(
        self, cmds: list[dict[str, Any]], timeout: float, clear_events: bool = False
    ) -> list[dict[str, Any]]:
        """*cmds* run by the tree's worker pool (like ``Pool.run``)."""
        return self._call(  # type: ignore[no-any-return]
            {"op": "pool", "cmds": cmds, "timeout": timeout, "clear_events": clear_events},
            timeout=timeout + 15,
        )

    def close(self) -> None:
        """Stop the tree process (it closes its own workers)."""
        try:
            self.conn.send({"op": "exit"})
        except Exception:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(2)


def start_trees(
    root: Path,
    baseline: Path,
    target: Callable[..., None],
    args: tuple[Any, ...],
    log: Callable[[str], None],
) -> tuple[list[TreePool], dict[str, Any]]:
    """Spawn the ``ours@current`` (*root*) and ``ours@baseline`` tree processes.

    Each runs ``target(conn, *args)`` and is registered in REMOTE as running ``ours``.
    Returns the two pools (close them when done) and the ``baseline`` entry of the
    results (both trees' commit, subject and package location).
    """
    trees: list[TreePool] = []
    try:
        for key, tree in ((CURRENT, root), (BASELINE, baseline)):
            log(f"starting the {key} process ({tree}) ...")
            tp = TreePool(tree, target, *args)
            trees.append(tp)
            REMOTE[key] = (tp, "ours")
    except BaseException:
        for tp in trees:
            tp.close()
        raise
    info = {
        "current": trees[0].info,
        "baseline": trees[1].info,
        "note": "both run 'ours' in a spawned process per tree that forks its workers; "
        "compare them with each other, not with the in-process rows",
    }
    return trees, info


def paired_to_baseline(per_round: dict[str, list[float]], rows: dict[str, Any]) -> None:
    """Set ``rows[ours@current]["paired_ratio_to_baseline"]``: the median over rounds of
    current/baseline per-round medians (when both ran)."""
    if CURRENT in per_round and BASELINE in per_round and CURRENT in rows:
        paired = [a / b for a, b in zip(per_round[CURRENT], per_round[BASELINE], strict=True)]
        rows[CURRENT]["paired_ratio_to_baseline"] = statistics.median(paired)


def fmt(v: float | None, digits: int = 1) -> str:
    """*v* with *digits* decimals, or ``-`` for None."""
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    """``a/b`` as ``1.234x``, or ``-`` when either is missing (or b is 0)."""
    return f"{a / b:.3f}x" if a is not None and b else "-"


def before_after_head(trees: dict[str, Any]) -> list[str]:
    """The lines that open the before/after section: which commit is which."""
    return [
        f"\nBefore/after ({CURRENT} vs {BASELINE}, both in spawned tree processes):",
        f"  current:  {trees['current'].get('commit')} {trees['current']['tree']}"
        + (
            " (+ uncommitted package changes)"
            if trees["current"].get("uncommitted_package_changes")
            else ""
        ),
        f"  baseline: {trees['baseline'].get('commit')} {trees['baseline']['tree']} "
        f"({trees['baseline'].get('subject', '')[:60]})",
    ]


#: The wake figures both benchmarks put in their before/after table: (field, what, digits).
WAKE_COMPARED = (
    ("p50_ms", "p50 ms", 3),
    ("p90_ms", "p90 ms", 3),
    ("from_release_return_p50_ms", "p50 from release reply ms", 3),
)


def uncontended_rows(u: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Before/after rows of the uncontended experiment (its ``rows``), if both ran."""
    if CURRENT not in u or BASELINE not in u:
        return []
    cur, base = u[CURRENT], u[BASELINE]
    rows = []
    for field, what in (("p50_us", "uncontended p50 us"), ("p90_us", "uncontended p90 us")):
        rows.append([what, fmt(base[field]), fmt(cur[field]), ratio(cur[field], base[field])])
    rows.append(
        [
            "uncontended, paired (median per-round ratio)",
            "",
            "",
            fmt(cur.get("paired_ratio_to_baseline"), 3) + "x",
        ]
    )
    for field, what, digits in (
        ("client_cpu_p50_us", "uncontended client CPU us", 1),
        ("redis_commands_per_op", "uncontended Redis commands/op", 1),
        ("redis_cpu_us_per_op", "uncontended Redis CPU us", 1),
        ("our_python_calls_per_op", "uncontended Python calls in django_redislock", 0),
        ("python_calls_per_op", "uncontended Python calls in all", 0),
    ):
        b, a = base.get(field), cur.get(field)
        if a is not None or b is not None:
            rows.append([what, fmt(b, digits), fmt(a, digits), ratio(a, b)])
    return rows


def compare_rows(
    prefix: str,
    cur: dict[str, Any] | None,
    base: dict[str, Any] | None,
    fields: tuple[tuple[str, str, int], ...],
) -> list[list[str]]:
    """Before/after rows ``[f"{prefix} {what}", base, cur, cur/base]`` for each
    ``(field, what, digits)`` of two result rows (none unless both exist)."""
    if not cur or not base:
        return []
    return [
        [
            f"{prefix} {what}".strip(),
            fmt(base.get(field), digits),
            fmt(cur.get(field), digits),
            ratio(cur.get(field), base.get(field)),
        ]
        for field, what, digits in fields
    ]


def lost_row(prefix: str, cur: dict[str, Any] | None, base: dict[str, Any] | None) -> list[str]:
    """Before/after row of lost updates / overlaps (counts, no ratio)."""
    if not cur or not base:
        return []
    return [
        f"{prefix} lost/overlaps",
        f"{base['lost_updates']}/{base['overlaps']}",
        f"{cur['lost_updates']}/{cur['overlaps']}",
        "",
    ]


BEFORE_AFTER_HEADERS = ["measure", "baseline", "current", "current/baseline"]
