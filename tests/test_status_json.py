"""``flask queue status --json``: what an autoscaler (KEDA, a cron) reads per queue."""

from __future__ import annotations

import json
from typing import Any

from tests import sample_app


def _status(app: Any) -> dict[str, Any]:
    result = app.test_cli_runner().invoke(args=["queue", "status", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def test_status_json_gives_each_queues_depth_and_wait(make_app: Any) -> None:
    app = make_app()
    assert _status(app)["queues"] == {}
    with app.app_context():
        sample_app.queue.pause("reports")
    assert _status(app)["queues"] == {  # paused, and no job in it yet
        "reports": {"counts": {}, "eligible": 0, "oldest_eligible_seconds": None, "paused": True}
    }
    with app.app_context():
        sample_app.add.enqueue(1, 2)
        sample_app.add.enqueue(3, 4)
        sample_app.add.using(delay=3600).enqueue(5, 6)  # not due: not eligible
        sample_app.report.enqueue(7)  # queue "reports"
    found = _status(app)
    assert found["live_workers"] == 0 and found["time"]
    default = found["queues"]["default"]
    assert default["counts"] == {"pending": 3} and default["eligible"] == 2
    assert default["oldest_eligible_seconds"] >= 0 and default["paused"] is False
    reports = found["queues"]["reports"]
    assert (reports["eligible"], reports["paused"]) == (1, True)
    sample_app.queue.worker(app=app).run(burst=True)
    after = _status(app)["queues"]["default"]
    assert after["counts"] == {"completed": 2, "pending": 1} and after["eligible"] == 0
    assert after["oldest_eligible_seconds"] is None
