"""Regenerate the admin screenshots in docs/images/ (admin-locks, admin-waiters,
admin-holders, admin-contention and admin-history .png) from the example project.

    .venv/bin/python docs/images/make_screenshots.py

Runs ``scripts/example`` on a free port (it starts its own redis-server and
Celery worker), then makes real contention: a ``build_report`` task running
under ``report:1`` with a duplicate queued (the worker skips it) and two waiters
from another process, the worker process running it stopped with SIGSTOP until
the admin shows it overdue (then SIGCONT), a lock held from the home page's "Hold
it" form, a view
guarded by ``@single_instance`` holding ``invoice:1042``, and two calls of a
``@single_instance(..., limit=3)`` function holding ``export:tenant-3``; then a
few seconds of guarded calls queueing for each other, timing out, and a lease
running out while another call waits, for the history and contention pages. It logs
in to the admin as admin/admin with Debian's Chromium (Playwright), saves the
pages, and stops everything it started. Needs ``/usr/bin/chromium`` and
Playwright (``pip install playwright``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
LIST_PATH = "/admin/django_redislock/heldlock/"
WAIT = 120.0


# -- the lock holders, each run in its own process (``--hold MODE``) --------------


def hold(mode: str) -> None:
    """Hold locks the way an application would, until stdin is closed."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example.settings")
    import django

    django.setup()
    from django.http import HttpRequest, HttpResponse
    from django.test import RequestFactory

    from django_redislock import locks, single_instance

    done = threading.Event()

    def generate_invoice(request: HttpRequest, pk: int) -> HttpResponse:
        print("held", flush=True)
        done.wait(WAIT)
        return HttpResponse("done")

    def export_tenant(tenant: str, ready: threading.Semaphore) -> None:
        ready.release()
        done.wait(WAIT)

    # Its dotted name is the purpose the admin shows: make it look like an app's function.
    export_tenant.__module__, export_tenant.__qualname__ = "billing", "export_tenant"
    if mode == "view":
        view = single_instance("invoice:{pk}", ttl=30)(generate_invoice)
        request = RequestFactory().post("/invoices/1042/generate/")
        threading.Thread(target=view, args=(request,), kwargs={"pk": 1042}).start()
    elif mode == "export":
        export = single_instance("export:{tenant}", limit=3, ttl=60)(export_tenant)
        ready = threading.Semaphore(0)
        for _ in range(2):
            threading.Thread(target=export, args=("tenant-3", ready)).start()
        for _ in range(2):
            if not ready.acquire(timeout=WAIT):
                raise SystemExit("the export calls did not start")
        print("held", flush=True)
    elif mode == "churn":
        churn()
        print("held", flush=True)
        return
    elif mode == "waiter":
        first = locks.lock("report:1", ttl=30, purpose="report for account 1 (API call)")
        threading.Thread(target=first.acquire, kwargs={"timeout": WAIT}, daemon=True).start()
        while not (info := locks.get("report:1")) or not info.waiters:
            time.sleep(0.05)  # queued first: the next thread waits behind it
        threading.Thread(target=locks.lock("report:1", ttl=30).acquire, daemon=True).start()
        print("waiting", flush=True)
    sys.stdin.readline()
    done.set()


def churn() -> None:
    """A few seconds of a busy application: calls of a guarded ``sync_account`` and
    ``import_feed`` that queue for each other (hand-offs), some that give up waiting
    (timeouts), and one holder whose lease runs out while others wait (expiry), so
    the detail page has a history and the contention page has rows."""
    import random

    from django_redislock import locks, single_instance
    from django_redislock.exceptions import LockNotAcquired

    def sync_account(account_id: int, seconds: float) -> None:
        time.sleep(seconds)

    def import_feed(feed: str, seconds: float) -> None:
        time.sleep(seconds)

    sync_account.__module__, sync_account.__qualname__ = "accounts.tasks", "sync_account"
    import_feed.__module__, import_feed.__qualname__ = "feeds.tasks", "import_feed"
    sync = single_instance("sync:{account_id}", ttl=30, timeout=0.8)(sync_account)
    feed = single_instance("import:{feed}", ttl=30, timeout=5)(import_feed)
    chance = random.Random(7)

    def calls(target: Any, key: Any, count: int, longest: float) -> None:
        for _ in range(count):
            try:
                target(key, chance.uniform(0.1, longest))
            except LockNotAcquired:
                pass  # a timeout: recorded in the lock's history

    threads = [
        threading.Thread(target=calls, args=(sync, account, 5, 0.9))
        for account in (7, 7, 7, 12, 12)
    ] + [threading.Thread(target=calls, args=(feed, "prices", 3, 0.4)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    # A holder that stops renewing (as a crashed process would) while a call waits.
    stuck = locks.lock(
        "sync:12",
        ttl=1,
        auto_renew=False,
        owner="stuck worker",
        purpose="accounts.tasks.sync_account",
    )
    if stuck.acquire(timeout=10):
        patient = single_instance("sync:{account_id}", ttl=30, timeout=5)(sync_account)
        patient(12, 0.2)  # waits (another owner) until the stuck lease runs out, then runs


# -- the driver --------------------------------------------------------------------


def free_port() -> int:
    """A free loopback port (the package's helper, imported from the checkout)."""
    sys.path.insert(0, str(ROOT))
    from django_redislock.testing import free_port as find

    return find()


def wait_for(predicate: Any, what: str) -> Any:
    """Poll *predicate* until it returns something truthy, for at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def start_example(port: int, workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """``scripts/example`` on *port* with its own database, logging to a file."""
    log = workdir / "example.log"
    env = {**os.environ, "PORT": str(port), "EXAMPLE_DATABASE": str(workdir / "db.sqlite3")}
    env.pop("REDIS_URL", None)  # the example starts its own redis-server
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(ROOT / "scripts" / "example")],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, log


def stop_example(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the script (it stops its children); SIGKILL its session if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)  # the worker finishes the running task (20 s at most)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def answers(url: str) -> bool:
    """Whether *url* answers at all."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def example_redis_url(base: str, log: Path) -> str | None:
    """The Redis URL ``scripts/example`` printed, once its site answers; else None."""
    match = re.search(r"Redis:\s+(redis://\S+)", log.read_text())
    return match.group(1) if match and answers(base + "/") else None


def lock_row(base: str, name: str) -> dict[str, Any] | None:
    """The example's /locks.json row of *name*, or None when it is not held."""
    with urllib.request.urlopen(f"{base}/locks.json?prefix={name}", timeout=5) as response:
        return next((row for row in json.load(response)["locks"] if row["name"] == name), None)


def held(base: str, name: str) -> bool:
    """Whether the example's /locks.json lists *name*."""
    return lock_row(base, name) is not None


def start_holder(mode: str, redis_url: str) -> subprocess.Popen[str]:
    """Run ``hold(mode)`` in another process; return once it holds (or waits)."""
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "example_project"), str(ROOT)]),
    }
    process = subprocess.Popen(
        [sys.executable, __file__, "--hold", mode],
        cwd=ROOT / "example_project",
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line not in ("held", "waiting"):
        raise SystemExit(f"the {mode} holder failed")
    return process


def stop_report_worker(base: str) -> int:
    """SIGSTOP the worker process running ``report:1``'s task; return its pid once the
    example shows the lock overdue (its 10 s lease then has about 5 s left)."""
    row = lock_row(base, "report:1")
    if row is None or not row["pid"]:
        raise SystemExit("report:1 is not held by a worker process")
    os.kill(row["pid"], signal.SIGSTOP)
    try:
        wait_for(lambda: (lock_row(base, "report:1") or {}).get("overdue"), "report:1 overdue")
    except BaseException:
        os.kill(row["pid"], signal.SIGCONT)
        raise
    return int(row["pid"])


def submit(page: Any, form: str, **fields: str) -> None:
    """Fill and submit one of the example home page's forms."""
    for field, value in fields.items():
        page.fill(f"#{form} input[name={field}]", value)
    page.click(f"#{form} button[type=submit]")
    page.wait_for_load_state()


def take_screenshots(base: str, redis_url: str) -> None:
    """Make the contention, then save the admin pages into docs/images/."""
    from playwright.sync_api import sync_playwright

    holders: list[subprocess.Popen[str]] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 700})
            page.set_default_timeout(20_000)
            page.goto(base + "/")
            submit(page, "report", account_id="1", seconds="60")
            wait_for(lambda: held(base, "report:1"), "the worker to run build_report")
            submit(page, "report", account_id="1", seconds="60")  # a duplicate: skipped
            submit(page, "hold", name="billing:account-17", seconds="60")
            holders += [start_holder(mode, redis_url) for mode in ("waiter", "view", "export")]
            page.goto(f"{base}/admin/login/?next={LIST_PATH}")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "admin")
            page.click("input[type=submit]")
            page.wait_for_url(base + LIST_PATH)
            if page.is_visible("#nav-sidebar"):
                page.click("#toggle-nav-sidebar")  # the table gets the whole width
            worker = stop_report_worker(base)
            try:
                page.reload()
                page.wait_for_selector("#result_list .redislock-overdue")
                page.screenshot(path=str(IMAGES / "admin-locks.png"), full_page=True)
                page.click("#result_list a:text-is('report:1')")
                page.wait_for_selector("#waiter_list .redislock-waiter")
                page.wait_for_selector(".field-renewed .redislock-overdue")
                page.screenshot(path=str(IMAGES / "admin-waiters.png"), full_page=True)
            finally:
                os.kill(worker, signal.SIGCONT)
            page.goto(base + LIST_PATH)
            page.click("a:text-is('export:tenant-3')")
            page.wait_for_selector("tr.redislock-holder")
            page.screenshot(path=str(IMAGES / "admin-holders.png"), full_page=True)
            holders.append(start_holder("churn", redis_url))
            page.goto(base + LIST_PATH + "contention/")
            page.wait_for_selector("a:text-is('sync:12')")
            page.screenshot(path=str(IMAGES / "admin-contention.png"), full_page=True)
            page.click("a:text-is('sync:12')")
            page.wait_for_selector("text=lease ran out while waited on")
            page.screenshot(path=str(IMAGES / "admin-history.png"), full_page=True)
            browser.close()
    finally:
        for process in holders:
            assert process.stdin is not None
            process.stdin.close()
        for process in holders:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def main() -> None:
    """Run the example, take the screenshots, stop everything."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="redislock-shots-") as tmp:
        process, log = start_example(port, Path(tmp))
        try:
            redis_url = wait_for(lambda: example_redis_url(base, log), "the example site")
            take_screenshots(base, redis_url)
        finally:
            stop_example(process)
    print(f"wrote the admin screenshots in {IMAGES}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--hold"]:
        hold(sys.argv[2])
    else:
        main()
